"""Eight threads, 100k leases: no block is ever granted twice, nothing leaks, the bound holds."""

from __future__ import annotations

import threading

import numpy as np

from fastpath.errors import UnavailableError
from fastpath.memory import BlockPool, PageAlignedAllocator, PoolConfig

from .conftest import KIB

THREADS = 8
LEASES_PER_THREAD = 12_500  # 100k in all
CAPACITY_BYTES = 256 * KIB  # below 8 threads x 64 KiB: the bound is exercised (evictions, waits)


def test_eight_threads_100k_leases_no_leak_bounded_high_water():
    pool = BlockPool(
        PageAlignedAllocator(),
        PoolConfig(capacity_bytes=CAPACITY_BYTES, max_block_bytes=64 * KIB, wait_timeout_s=30.0, trace_leases=False),
        name="stress",
    )
    sizes = np.array([1, 3000, 4096, 5000, 9000, 20_000, 40_000, 65_536])
    start = threading.Barrier(THREADS)
    failures: list[str] = []

    def worker(worker_id: int) -> None:
        rng = np.random.default_rng(worker_id)
        picks = rng.choice(sizes, LEASES_PER_THREAD)
        start.wait()
        try:
            for count, nbytes in enumerate(picks):
                with pool.lease(int(nbytes)) as lease:
                    stamp = lease.view(np.uint32, (2,)) if nbytes >= 8 else None
                    if stamp is not None:
                        stamp[:] = (worker_id, count)
                    words = lease.view(np.uint8, int(nbytes))
                    words[-1] = worker_id
                    if stamp is not None and tuple(stamp) != (worker_id, count) or words[-1] != worker_id:
                        failures.append(f"worker {worker_id} lease {count}: block shared with another lease")
                        return
        except UnavailableError as exc:  # must not happen: every lease is released promptly
            failures.append(str(exc))

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    stats = pool.stats()
    total = THREADS * LEASES_PER_THREAD
    assert (stats.leases, stats.releases, stats.outstanding, stats.bytes_in_use) == (total, total, 0, 0)
    assert stats.hits + stats.misses == total and stats.exhausted == 0
    assert stats.high_water_bytes <= CAPACITY_BYTES
    assert stats.high_water_reserved_bytes <= CAPACITY_BYTES
    # at most 8 blocks in use at once, each <= 64 KiB: the high-water mark is bounded by that too
    assert stats.high_water_bytes <= THREADS * 64 * KIB
    assert stats.evictions > 0  # the capacity bound was under pressure
    report = pool.close()
    assert report.ok, str(report)
    assert pool.allocator.frees == pool.allocator.allocations  # deferred frees (live views) done too
