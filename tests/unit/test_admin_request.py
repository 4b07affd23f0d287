"""The admin model's REQUEST parsing: every malformed command is an InvalidInputError (a 400 naming REQUEST and
what is wrong), never a raw Python exception (a 500) and never a parse of unbounded input."""

from __future__ import annotations

import pytest

from fastpath.errors import InvalidInputError
from fastpath.triton.admin import MAX_REQUEST_BYTES, parse_command


def test_a_command_object_is_returned_as_parsed():
    assert parse_command(b'{"command": "status", "model": "text_embedding"}') == {"command": "status", "model": "text_embedding"}


@pytest.mark.parametrize(("data", "message"), [
    (b"[" * 100_000 + b"]" * 100_000, f"REQUEST is 200000 bytes; a command is a JSON object of at most {MAX_REQUEST_BYTES} bytes"),
    (b'{"command": "status", "model": "' + b"a" * MAX_REQUEST_BYTES + b'"}', "REQUEST is 65570 bytes; a command is a JSON object of at most 65536 bytes"),
    (b"[" * 30_000 + b"]" * 30_000, "REQUEST is not a JSON command: nested too deeply to parse"),
    (b'{"version": ' + b"9" * 5000 + b"}", "REQUEST is not a UTF-8 JSON document: Exceeds the limit"),
    (b"\xff{}", "REQUEST is not a UTF-8 JSON document: 'utf-8' codec can't decode byte 0xff"),
    (b"{", "REQUEST is not a UTF-8 JSON document: Expecting property name"),
    (b"[1]", "REQUEST must be a JSON object"),
])
def test_malformed_requests_are_invalid_input_naming_request(data, message):
    with pytest.raises(InvalidInputError) as info:
        parse_command(data)
    assert str(info.value).startswith(message)
