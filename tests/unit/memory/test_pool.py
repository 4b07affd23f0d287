"""BlockPool: size classes, reuse, views, release errors, exhaustion, fallback, eviction, leaks."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from fastpath.errors import ConfigError, InvalidInputError, UnavailableError
from fastpath.memory import LeaseError, PageAlignedAllocator, PoolConfig

from .conftest import KIB, ClockCondition, SignallingCondition


def test_size_classes_are_powers_of_two_from_min_to_max():
    config = PoolConfig(capacity_bytes=1 << 20, min_block_bytes=4 * KIB, max_block_bytes=64 * KIB)
    assert config.size_classes() == (4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB)


@pytest.mark.parametrize(
    ("nbytes", "block"),
    [(1, 4 * KIB), (4 * KIB, 4 * KIB), (4 * KIB + 1, 8 * KIB), (12 * KIB, 16 * KIB), (16 * KIB, 16 * KIB)],
)
def test_lease_takes_smallest_class_that_fits(make_pool, nbytes, block):
    pool = make_pool()
    assert pool.size_class(nbytes) == block
    with pool.lease(nbytes) as lease:
        assert lease.block_bytes == block
        assert lease.nbytes == nbytes
        assert lease.address % 4096 == 0


def test_lease_larger_than_max_block_is_refused_without_waiting(make_pool):
    pool = make_pool()
    with pytest.raises(InvalidInputError, match=r"16385 bytes exceeds the largest block, max_block_bytes = 16384"):
        pool.lease(16 * KIB + 1)
    assert pool.stats().waits == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(min_block_bytes=3000), "min_block_bytes = 3000 must be a power of two"),
        (dict(capacity_bytes=8 * KIB, max_block_bytes=16 * KIB), "exceeds capacity_bytes"),
        (dict(min_block_bytes=32 * KIB, max_block_bytes=16 * KIB, capacity_bytes=64 * KIB), "exceeds max_block_bytes"),
        (dict(wait_timeout_s=-1.0), "wait_timeout_s = -1.0 must be >= 0"),
        (dict(fallback="unpinned"), "fallback = 'unpinned' is unknown"),
        (dict(fallback="pageable"), "needs fallback_capacity_bytes > 0"),
    ],
)
def test_config_validation_names_the_value(config, message):
    with pytest.raises(ConfigError, match=message):
        PoolConfig(**config)


def test_released_block_is_reused_without_allocation(make_pool):
    pool = make_pool()
    with pool.lease(5000) as first:
        address = first.address
    with pool.lease(6000) as second:  # same 8 KiB class
        assert second.address == address
    stats = pool.stats()
    assert (stats.leases, stats.releases, stats.hits, stats.misses, stats.allocations) == (2, 2, 1, 1, 1)
    assert (stats.bytes_in_use, stats.bytes_reserved, stats.high_water_bytes) == (0, 8 * KIB, 8 * KIB)


def test_zero_byte_lease_allocates_nothing_and_views_are_typed_empty(make_pool):
    pool = make_pool()
    with pool.lease(0) as lease:
        assert lease.block is None and lease.address == 0
        empty = lease.view(np.float32, (0, 4, 2))
        assert empty.shape == (0, 4, 2) and empty.dtype == np.float32
    assert pool.stats().allocations == 0


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        (np.float16, (3, 5)),
        (np.float32, (2, 3, 4)),
        (np.float64, (7,)),
        (np.int8, (11, 13)),
        (np.uint16, (4, 1, 9)),
        (np.int64, (2, 256)),
        (np.bool_, (17,)),
        (np.complex64, (5, 5)),
        (np.dtype([("x", np.float32), ("id", np.int64)]), (6,)),
        (np.float32, ()),
    ],
)
def test_views_of_any_dtype_and_shape_read_back_what_was_written(make_pool, dtype, shape):
    pool = make_pool()
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    rng = np.random.default_rng(nbytes)
    expected = np.frombuffer(rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes(), dtype=dtype).reshape(shape)
    with pool.lease(nbytes) as lease:
        view = lease.view(dtype, shape)
        assert view.shape == shape and view.dtype == dtype and view.flags.writeable
        view[...] = expected
        raw = lease.view(np.uint8, nbytes)
        assert raw.tobytes() == expected.tobytes()
        again = lease.view(dtype, shape)
        assert again.tobytes() == expected.tobytes()


def test_views_at_offsets_share_one_block(make_pool):
    pool = make_pool()
    with pool.lease(4 * KIB) as lease:
        head = lease.view(np.int32, (4,), offset_bytes=0)
        tail = lease.view(np.float64, (2,), offset_bytes=16)
        head[:] = [1, 2, 3, 4]
        tail[:] = [0.5, -2.0]
        assert lease.view(np.int32, (4,)).tolist() == [1, 2, 3, 4]
        assert lease.view(np.float64, (3,), offset_bytes=8)[1:].tolist() == [0.5, -2.0]


def test_view_errors_name_the_problem(make_pool):
    pool = make_pool()
    lease = pool.lease(100)
    with pytest.raises(ValueError, match=r"needs 104 bytes, lease #1 has 100"):
        lease.view(np.float32, (26,))
    with pytest.raises(ValueError, match="holds Python objects"):
        lease.view(object, (2,))
    with pytest.raises(ValueError, match="not a multiple of float64's alignment 8"):
        lease.view(np.float64, (2,), offset_bytes=4)
    lease.release()
    with pytest.raises(LeaseError, match="was released; take a new lease"):
        lease.view(np.uint8, (1,))


def test_double_release_is_an_error_and_counts_once(make_pool):
    pool = make_pool()
    lease = pool.lease(1000)
    lease.release()
    with pytest.raises(LeaseError, match=r"lease #1 of pool 'host' was already released"):
        pool.release(lease)
    with pytest.raises(LeaseError, match="already released"):
        lease.release()
    with lease:  # __exit__ of an already released lease is a no-op, not a second release
        pass
    stats = pool.stats()
    assert (stats.releases, stats.outstanding, stats.bytes_in_use) == (1, 0, 0)
    assert len(pool._free[4 * KIB]) == 1  # the block is on its free list exactly once


def test_foreign_release_is_refused_and_leaves_both_pools_intact(make_pool):
    pool_a, pool_b = make_pool(), make_pool()
    pool_b.name = "other"
    lease = pool_a.lease(3000)
    with pytest.raises(LeaseError, match="belongs to pool 'host', not 'other'"):
        pool_b.release(lease)
    assert pool_a.stats().outstanding == 1 and pool_b.stats().releases == 0
    lease.release()
    assert pool_a.stats().outstanding == 0


def test_exhausted_pool_waits_the_timeout_then_raises_retryable_error(make_pool, clock):
    condition = ClockCondition(clock)
    pool = make_pool(condition=condition, capacity_bytes=32 * KIB, wait_timeout_s=0.25)
    held = [pool.lease(16 * KIB), pool.lease(16 * KIB)]
    with pytest.raises(UnavailableError, match=r"exhausted: a lease of 10000 bytes \(block 16384\) waited 0.25 s") as info:
        pool.lease(10_000)
    assert info.value.triton_code == "UNAVAILABLE"
    assert "capacity_bytes = 32768, 32768 bytes in use by 2 lease(s)" in str(info.value)
    assert condition.waited_s == [0.25]
    stats = pool.stats()
    assert (stats.waits, stats.exhausted, stats.bytes_reserved, stats.waiting) == (1, 1, 32 * KIB, 0)
    with pytest.raises(UnavailableError):
        pool.lease(1, timeout_s=0.0)  # explicit timeout: no wait at all
    assert condition.waited_s == [0.25]
    for lease in held:
        lease.release()
    with pool.lease(10_000) as lease:
        assert lease.block_bytes == 16 * KIB


def test_waiting_lease_gets_the_block_a_release_returns(make_pool):
    condition = SignallingCondition()
    pool = make_pool(condition=condition, capacity_bytes=16 * KIB, wait_timeout_s=30.0)
    holder = pool.lease(16 * KIB)
    result = {}

    def waiter():
        with pool.lease(12 * KIB) as lease:
            result["address"] = lease.address

    thread = threading.Thread(target=waiter)
    thread.start()
    assert condition.entered.wait(timeout=10)
    assert pool.stats().waiting == 1
    address = holder.address
    holder.release()
    thread.join(timeout=10)
    assert result["address"] == address
    stats = pool.stats()
    assert (stats.waits, stats.exhausted, stats.hits, stats.misses) == (1, 0, 1, 1)


def test_close_wakes_waiters_with_unavailable(make_pool):
    condition = SignallingCondition()
    pool = make_pool(condition=condition, capacity_bytes=16 * KIB, wait_timeout_s=30.0)
    holder = pool.lease(16 * KIB)
    errors = []

    def waiter():
        try:
            pool.lease(4 * KIB)
        except UnavailableError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert condition.entered.wait(timeout=10)
    pool.close()
    thread.join(timeout=10)
    assert errors and "pool is closed" in errors[0]
    holder.release()  # released after close: freed, not pooled
    assert pool.stats().bytes_reserved == 0


def test_pageable_fallback_is_counted_bounded_and_freed(make_pool, clock):
    pool = make_pool(condition=ClockCondition(clock), capacity_bytes=16 * KIB, wait_timeout_s=0.1,
                     fallback="pageable", fallback_capacity_bytes=16 * KIB)
    pinned = pool.lease(16 * KIB)
    fallback = pool.lease(10_000)
    assert fallback.fallback and not fallback.pinned and fallback.block_bytes == 16 * KIB
    fallback.view(np.uint8, 10_000)[:] = 7
    with pytest.raises(UnavailableError, match="exhausted"):
        pool.lease(100)  # fallback capacity is used up too
    stats = pool.stats()
    assert (stats.fallbacks, stats.exhausted, stats.fallback_bytes_in_use, stats.bytes_reserved) == (1, 1, 16 * KIB, 16 * KIB)
    fallback.release()
    pinned.release()
    stats = pool.stats()
    assert (stats.fallback_bytes_in_use, stats.frees) == (0, 1)  # the fallback block went back to the OS


def test_idle_blocks_of_other_classes_are_evicted_to_stay_within_capacity(make_pool):
    pool = make_pool(capacity_bytes=16 * KIB)
    pool.lease(16 * KIB).release()  # 16 KiB idle on its free list
    with pool.lease(4 * KIB) as small:
        assert small.block_bytes == 4 * KIB
    stats = pool.stats()
    assert (stats.evictions, stats.frees, stats.bytes_reserved) == (1, 1, 4 * KIB)
    assert stats.high_water_reserved_bytes <= 16 * KIB


def take_and_forget(pool):
    """Takes a lease and drops it: the leak the report must point at."""
    pool.lease(2500)


def test_close_reports_leaks_with_where_they_were_taken(make_pool, clock, caplog):
    pool = make_pool()
    take_and_forget(pool)
    with pool.lease(100):
        pass
    clock.now_s += 2.5
    with caplog.at_level(logging.WARNING, logger="fastpath.memory"):
        report = pool.close()
    assert not report.ok and len(report.leaks) == 1
    leak = report.leaks[0]
    assert (leak.lease_id, leak.nbytes, leak.block_bytes, leak.age_s) == (1, 2500, 4 * KIB, 2.5)
    assert "take_and_forget" in leak.stack and "pool.lease(2500)" in leak.stack
    assert "1 lease(s) never released" in caplog.text and "take_and_forget" in caplog.text
    stats = pool.stats()
    assert stats.frees == 1 and stats.bytes_reserved == 4 * KIB  # idle block freed, leaked one kept
    assert pool.close().leaks == report.leaks  # idempotent
    with pytest.raises(UnavailableError, match="closed"):
        pool.lease(10)


def test_free_is_deferred_while_a_view_is_alive(make_pool):
    allocator = PageAlignedAllocator()
    pool = make_pool(allocator=allocator)
    with pool.lease(4 * KIB) as lease:
        kept = lease.view(np.float32, (8,))
        kept[:] = 3.0
    pool.close()
    assert (allocator.frees, allocator.deferred_frees) == (0, 1)
    assert kept.tolist() == [3.0] * 8  # still backed by live memory
    del kept
    assert allocator.release_deferred() == 0
    assert allocator.frees == 1


def test_untraced_leases_say_so_in_the_report(make_pool):
    pool = make_pool(trace_leases=False)
    pool.lease(10)
    assert "trace_leases is off" in pool.close().leaks[0].stack


def test_what_a_lease_keeps_serves_the_blocks_next_leases_until_the_pool_frees_it(make_pool, clock):
    """Invariants: a value kept under a key is the very object the next lease of that block gets (made once); another
    block makes its own; past ``most`` keys all go; when the pool frees the block (eviction), what it kept goes
    first, so the free is not deferred by kept views; zero-byte and fallback leases keep nothing."""
    pool = make_pool(capacity_bytes=16 * KIB)
    made = []

    def make(lease):
        return lambda: made.append(1) or lease.view(np.int64, (2, 4))

    with pool.lease(4 * KIB) as lease:
        first = lease.kept("v", make(lease))
        first[:] = 3
    with pool.lease(4 * KIB) as lease:  # the same block back from its free list
        assert lease.kept("v", make(lease)) is first and len(made) == 1
        for key in range(3):
            lease.kept(key, make(lease), most=3)
        assert lease.kept("v", make(lease), most=3) is not first  # the fourth key dropped them all
    del first  # the test's own view would defer the free
    with pool.lease(16 * KIB) as big:  # room only by evicting the idle 4 KiB block: freed, not deferred
        big.kept("v", make(big))
    stats = pool.stats()
    assert stats.evictions == 1 and stats.frees == 1 and pool.allocator.deferred_frees == 0
    with pool.lease(0) as empty:
        assert empty.kept("v", lambda: "made") == "made" and empty.kept("v", lambda: "again") == "again"
    fallback_pool = make_pool(condition=ClockCondition(clock), capacity_bytes=4 * KIB, max_block_bytes=4 * KIB,
                              wait_timeout_s=0.0, fallback="pageable", fallback_capacity_bytes=4 * KIB)
    with fallback_pool.lease(4 * KIB), fallback_pool.lease(100) as fallback:
        assert fallback.fallback and fallback.kept("v", lambda: 1) == 1 and not fallback.block.kept
