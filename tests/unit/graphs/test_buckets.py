"""Bucket dispatch (pure): sorted sizes, bisect to the smallest bucket that holds a batch, capture order."""

import pytest

from fastpath.errors import ConfigError
from fastpath.graphs import Bucket, BucketGrid


@pytest.fixture
def grid():
    return BucketGrid((8, 1, 4, 2, 4), (128, 32, 16))


def test_sizes_are_sorted_and_deduplicated(grid):
    assert grid.batch_sizes == (1, 2, 4, 8) and grid.lengths == (16, 32, 128)
    assert (grid.max_batch, grid.max_length) == (8, 128)
    assert len(grid.buckets) == 12


@pytest.mark.parametrize(
    ("batch", "length", "bucket"),
    [
        (1, 1, Bucket(1, 16)),
        (1, 16, Bucket(1, 16)),
        (1, 17, Bucket(1, 32)),
        (3, 33, Bucket(4, 128)),
        (4, 32, Bucket(4, 32)),
        (5, 100, Bucket(8, 128)),
        (8, 128, Bucket(8, 128)),
    ],
)
def test_select_picks_the_smallest_bucket_that_holds_the_batch(grid, batch, length, bucket):
    assert grid.select(batch, length) == bucket


@pytest.mark.parametrize(("batch", "length"), [(9, 16), (1, 129), (64, 512)])
def test_select_returns_none_beyond_the_largest_bucket(grid, batch, length):
    assert grid.select(batch, length) is None


@pytest.mark.parametrize(("batch", "length"), [(0, 16), (4, 0), (-1, 3)])
def test_empty_batches_never_reach_an_engine(grid, batch, length):
    with pytest.raises(ValueError, match="at least 1 x 1"):
        grid.select(batch, length)


def test_capture_order_is_largest_first_by_tokens_then_batch(grid):
    order = grid.capture_order()
    assert order[0] == Bucket(8, 128) and order[-1] == Bucket(1, 16)
    tokens = [b.tokens for b in order]
    assert tokens == sorted(tokens, reverse=True)
    assert order.index(Bucket(8, 16)) < order.index(Bucket(4, 32))  # both 128 tokens: larger batch first
    assert sorted(order) == sorted(grid.buckets)


@pytest.mark.parametrize(("batches", "lengths"), [((), (16,)), ((1,), ()), ((0, 1), (16,)), ((1,), (-16,))])
def test_invalid_sizes_are_refused_with_the_value(batches, lengths):
    with pytest.raises(ConfigError, match="positive integers"):
        BucketGrid(batches, lengths)
