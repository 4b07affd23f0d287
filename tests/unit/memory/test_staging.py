"""stage(): request tensors copied once into one contiguous block, with clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from fastpath.errors import InvalidInputError
from fastpath.memory import ParallelCopier, stage

from .conftest import KIB


def test_parts_are_concatenated_into_one_pool_block(make_pool):
    pool = make_pool()
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((rows, 3, 4)).astype(np.float32) for rows in (1, 4, 2)]
    with stage(pool, "pixel_values", parts) as staged:
        assert staged.rows == (1, 4, 2)
        assert staged.array.shape == (7, 3, 4) and staged.array.dtype == np.float32
        np.testing.assert_array_equal(staged.array, np.concatenate(parts))
        assert staged.array.ctypes.data == staged.lease.address  # the data lives in the leased block
        assert staged.nbytes == 7 * 12 * 4 and staged.lease.block_bytes == 4 * KIB
    assert pool.stats().outstanding == 0


def test_single_part_is_copied_not_aliased(make_pool):
    pool = make_pool()
    ids = np.arange(24, dtype=np.int64).reshape(2, 12)
    with stage(pool, "input_ids", [ids]) as staged:
        ids[0, 0] = -1
        assert staged.array[0, 0] == 0


def test_zero_row_batch_takes_no_block(make_pool):
    pool = make_pool()
    with stage(pool, "boxes", [np.empty((0, 4, 2), np.float32), np.empty((0, 4, 2), np.float32)]) as staged:
        assert staged.array.shape == (0, 4, 2) and staged.nbytes == 0 and staged.lease.block is None
    assert pool.stats().allocations == 0


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([], "input x: a batch needs at least one request tensor"),
        ([np.float32(1.0) * np.ones(())], "request 0 is a 0-d array"),
        ([np.array([["a"]], dtype=object)], r"dtype object \(BYTES\) cannot be staged"),
        ([np.ones((1, 3), np.float32), np.ones((1, 3), np.float64)], r"request 1 has float64\[1, 3\], expected float32\[n, 3\]"),
        ([np.ones((1, 3), np.int64), np.ones((2, 4), np.int64)], r"request 1 has int64\[2, 4\], expected int64\[n, 3\]"),
    ],
)
def test_parts_that_do_not_form_a_batch_are_refused(make_pool, parts, message):
    pool = make_pool()
    with pytest.raises(InvalidInputError, match=message):
        stage(pool, "x", parts)
    assert pool.stats().outstanding == 0


def test_lease_is_released_when_the_copy_fails(make_pool):
    pool = make_pool()

    class Exploding(np.ndarray):
        def __array_function__(self, func, types, args, kwargs):
            raise RuntimeError("copy failed")

    parts = [np.ones((1, 8), np.float32).view(Exploding), np.ones((1, 8), np.float32).view(Exploding)]
    with pytest.raises(RuntimeError, match="copy failed"):
        stage(pool, "x", parts)
    stats = pool.stats()
    assert (stats.leases, stats.releases, stats.outstanding) == (1, 1, 0)


@pytest.mark.parametrize(("rows", "tasks"), [((1,), 1), ((5, 1, 3), 9), ((64,), 7)])
def test_parallel_copier_writes_the_same_batch(make_pool, rows, tasks):
    pool = make_pool(capacity_bytes=1 << 20, max_block_bytes=1 << 20)
    rng = np.random.default_rng(len(rows))
    parts = [rng.standard_normal((n, 7, 33)).astype(np.float32) for n in rows]
    with ParallelCopier(3, min_parallel_bytes=0, min_chunk_bytes=1) as copier:
        for batch in range(2):  # reusable across batches
            with stage(pool, "x", parts, copier=copier) as staged:
                np.testing.assert_array_equal(staged.array, np.concatenate(parts))
            # chunks of ~nbytes / (2 * workers): 1 row each for 9 rows, 10 rows each for 64 rows
            assert copier.tasks_submitted == tasks * (batch + 1)


def test_parallel_copier_rejects_zero_workers():
    with pytest.raises(ValueError, match="workers >= 1, got 0"):
        ParallelCopier(0)
