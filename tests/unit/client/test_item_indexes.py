"""embed() splits long lists into requests of max_batch_size texts and detect_text() sends one image per
request; every per-item error must still name the item's index in the caller's list (TEXT[70], not
TEXT[6] of the second request): the renumbering here, against real servers in tests/e2e/test_client.py."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from fastpath_client import InvalidInputError
from fastpath_client._core import items_from
from fastpath_client.errors import from_exception
from fastpath_client.tensors import renumber_items


def test_renumber_items_moves_only_the_named_tensors_indexes():
    message = "TEXT[6] is not valid UTF-8: byte 0xff at offset 3; MY_TEXT[2] and TEXT[12]; 64 texts"
    assert renumber_items(message, ["TEXT"], 64) == \
        "TEXT[70] is not valid UTF-8: byte 0xff at offset 3; MY_TEXT[2] and TEXT[76]; 64 texts"
    assert renumber_items(message, ["TEXT"], 0) == message
    images = "input IMAGE image 0 is 0x5 pixels; input IMAGE_BYTES element 0 is empty (0 bytes)"
    assert renumber_items(images, ["IMAGE", "IMAGE_BYTES"], 5) == \
        "input IMAGE image 5 is 0x5 pixels; input IMAGE_BYTES element 5 is empty (0 bytes)"


def test_items_from_renumbers_a_mapped_server_error_and_keeps_its_class():
    original = from_exception(InferenceServerException(msg="TEXT[6] is not valid UTF-8: byte 0xff", status="400"),
                              url="127.0.0.1:8000", model="text_embedding")
    with pytest.raises(InvalidInputError) as info, items_from(64, ("TEXT",)):
        raise original
    error = info.value
    assert type(error) is type(original) and error.__cause__ is original
    assert str(error) == "HTTP 400 from model 'text_embedding' at 127.0.0.1:8000: TEXT[70] is not valid UTF-8: byte 0xff"
    assert error.server_message == "TEXT[70] is not valid UTF-8: byte 0xff"
    assert (error.status, error.url, error.model) == ("400", "127.0.0.1:8000", "text_embedding")
    with pytest.raises(InvalidInputError) as info:  # the first request's errors pass through unchanged
        with items_from(0, ("TEXT",)):
            raise original
    assert info.value is original
