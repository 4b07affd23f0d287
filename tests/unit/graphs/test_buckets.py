"""Bucket dispatch (pure): sorted sizes, bisect to the smallest bucket that holds a batch, capture order."""

import pytest

from fastpath.errors import ConfigError
from fastpath.graphs import Bucket, BucketGrid, ImageSideBuckets
from fastpath.graphs.buckets import Sizes, batch_sizes_of


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


@pytest.mark.parametrize(
    ("value", "up", "up_or_largest", "down", "above"),
    [(0, 1, 1, None, 1), (1, 1, 1, 1, 2), (3, 4, 4, 2, 4), (4, 4, 4, 4, 8), (7, 8, 8, 4, 8), (8, 8, 8, 8, None),
     (9, None, 8, 8, None)],
)
def test_sizes_snap_to_the_nearest_bucket_in_each_direction(value, up, up_or_largest, down, above):
    """Invariants: up >= value and down <= value are the nearest sizes on each side (None past the ends);
    above > value; up_or_largest is up, or the largest past it."""
    sizes = Sizes((1, 2, 4, 8))
    assert (sizes.up(value), sizes.up_or_largest(value), sizes.down(value), sizes.above(value)) == (up, up_or_largest, down, above)
    assert sizes == (1, 2, 4, 8) and sizes.largest == 8 and sizes.position(value) == sum(s < value for s in sizes)


@pytest.mark.parametrize("values", [(), (2, 1), (1, 1, 2), (0, 4)])
def test_sizes_refuse_a_list_that_is_not_strictly_increasing_positive_naming_it(values):
    with pytest.raises(ConfigError, match=r"batch_buckets = .*: expected a strictly increasing list of positive integers"):
        Sizes(values, name="batch_buckets")


def test_sizes_within_what_an_engine_captured_or_refused_with_what_a_size_would_cost():
    """Invariant: a subset of the captured sizes passes unchanged; any other size is refused, naming the
    parameter, its value, the captured sizes and the padding the engine would add."""
    assert Sizes((1, 2, 8)).within((1, 2, 4, 8), name="batch_buckets") == (1, 2, 8)
    with pytest.raises(ConfigError, match=r"'batch_buckets' = 1,3,6: 3, 6 are not among the sizes the engine captured "
                                          r"\(1,2,4,8\), so a batch of 3 would be padded again to 4; use a subset of them"):
        Sizes((1, 3, 6)).within((8, 4, 2, 1), name="batch_buckets")
    with pytest.raises(ConfigError, match=r"16 is not among .* so a batch of 16 would have no bucket"):
        Sizes((1, 16)).within((1, 2, 4, 8), name="batch_buckets")


def test_grid_and_image_sides_snap_through_sizes():
    grid = BucketGrid((8, 1, 4, 2), (128, 16))
    assert isinstance(grid.batch_sizes, Sizes) and isinstance(grid.lengths, Sizes)
    assert batch_sizes_of(grid.buckets) == (1, 2, 4, 8)
    sides = ImageSideBuckets((640, 320, 960))
    assert [sides.snap_side(side) for side in (32, 320, 352, 960, 992)] == [320, 320, 640, 960, 992]
    assert ImageSideBuckets(()).snap((352, 96)) == (352, 96)  # no buckets: every image keeps its shape
