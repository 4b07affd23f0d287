"""Host staging: real rows padded on the right, filler rows of valid data after them, never stale rows."""

import numpy as np
import pytest

from fastpath.errors import EngineError
from fastpath.graphs import BERT_INPUTS, PaddedInput, batch_shape, filler_rows, stage_rows

IDS, MASK, TYPES = BERT_INPUTS


def test_rows_are_padded_and_filler_rows_are_an_empty_text():
    dest = np.full((4, 6), -7, dtype=np.int64)  # stale data from an earlier batch
    stage_rows(dest, np.array([[101, 7592, 2088, 102], [101, 102, 0, 0]]), IDS)
    np.testing.assert_array_equal(dest, [
        [101, 7592, 2088, 102, 0, 0],
        [101, 102, 0, 0, 0, 0],
        [101, 102, 0, 0, 0, 0],  # filler: [CLS] [SEP], never garbage
        [101, 102, 0, 0, 0, 0],
    ])
    mask = np.full((4, 6), -7, dtype=np.int64)
    stage_rows(mask, np.array([[1, 1, 1, 1], [1, 1, 0, 0]]), MASK)
    assert mask[2:].tolist() == [[1, 1, 0, 0, 0, 0]] * 2  # filler rows attend to two tokens: no all-masked row


def test_exact_fit_leaves_no_filler():
    dest = np.zeros((2, 3), dtype=np.int64)
    source = np.arange(6).reshape(2, 3)
    stage_rows(dest, source, TYPES)
    np.testing.assert_array_equal(dest, source)


@pytest.mark.parametrize("shape", [(5, 4), (2, 7)])
def test_a_batch_larger_than_the_bucket_is_refused(shape):
    with pytest.raises(EngineError, match="does not fit the bucket"):
        stage_rows(np.zeros((4, 6), dtype=np.int64), np.zeros(shape, dtype=np.int64), IDS)


def test_filler_longer_than_the_bucket_is_refused():
    with pytest.raises(EngineError, match="filler row"):
        stage_rows(np.zeros((2, 2), dtype=np.int64), np.zeros((1, 1), dtype=np.int64), PaddedInput("x", 0, (1, 2, 3)))


def test_filler_rows():
    np.testing.assert_array_equal(filler_rows(2, 4, MASK), [[1, 1, 0, 0], [1, 1, 0, 0]])


def test_batch_shape_checks_every_input():
    ok = {spec.name: np.zeros((3, 5), dtype=np.int64) for spec in BERT_INPUTS}
    assert batch_shape(ok, BERT_INPUTS) == (3, 5)
    with pytest.raises(EngineError, match="'token_type_ids' is missing"):
        batch_shape({k: v for k, v in ok.items() if k != "token_type_ids"}, BERT_INPUTS)
    with pytest.raises(EngineError, match=r"has shape \(3, 4\); 'input_ids' has \(3, 5\)"):
        batch_shape({**ok, "attention_mask": np.zeros((3, 4), dtype=np.int64)}, BERT_INPUTS)
    with pytest.raises(EngineError, match="2-D integer array"):
        batch_shape({**ok, "input_ids": np.zeros((3, 5), dtype=np.float32)}, BERT_INPUTS)
