"""Giving memory back: BlockPool.release_idle, the MemoryReturner's rule, glibc's malloc_trim, /proc readings."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from fastpath.memory import MemoryReturner
from tests.unit.memory.conftest import KIB

MIB = 1 << 20


def test_release_idle_frees_the_largest_idle_blocks_down_to_the_kept_bytes(make_pool):
    """Invariant: after release_idle(keep), idle bytes <= keep, freed largest first; leased blocks stay."""
    pool = make_pool(capacity_bytes=1 * MIB, max_block_bytes=256 * KIB)
    leases = [pool.lease(n) for n in (256 * KIB, 128 * KIB, 64 * KIB, 8 * KIB)]
    held = pool.lease(256 * KIB)
    for lease in leases:
        lease.release()
    allocations = pool.allocator.allocations

    freed = pool.release_idle(keep_bytes=80 * KIB)

    assert freed == (256 + 128) * KIB  # the 64 + 8 KiB left fit in 80 KiB
    stats = pool.stats()
    assert stats.bytes_reserved == (256 + 64 + 8) * KIB and stats.bytes_in_use == 256 * KIB
    assert pool.allocator.frees == 2
    assert pool.release_idle(keep_bytes=80 * KIB) == 0
    pool.lease(64 * KIB).release()  # a kept class is served without allocating
    assert pool.allocator.allocations == allocations
    again = pool.lease(200 * KIB)  # a freed class allocates again
    assert pool.allocator.allocations == allocations + 1
    again.release()
    held.release()


class Rss:
    """This process's resident bytes as the returner sees them, set by the test."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


class Trim:
    """Counts trims; each one lowers the resident set to ``to``."""

    def __init__(self, rss: Rss, to: int) -> None:
        self.rss, self.to, self.calls = rss, to, 0

    def __call__(self) -> bool:
        self.calls += 1
        self.rss.value = self.to
        return True


def test_returner_trims_after_growth_or_a_freed_block_and_not_otherwise(make_pool):
    """Invariants: a trim runs when a pool block was freed, or when the resident set grew by trim_growth_bytes
    above its level after the last trim (or its lowest since); never otherwise."""
    pool = make_pool(capacity_bytes=1 * MIB, max_block_bytes=512 * KIB)
    rss = Rss(1000 * MIB)
    trim = Trim(rss, to=1010 * MIB)
    returner = MemoryReturner([pool], keep_idle_bytes=64 * KIB, trim_growth_bytes=100 * MIB, read_rss=rss, trim=trim)

    rss.value = 1099 * MIB
    assert returner.after_batch() is False and trim.calls == 0  # grew 99 MiB: below the growth
    rss.value = 1100 * MIB
    assert returner.after_batch() is True and trim.calls == 1  # grew 100 MiB
    rss.value = 1109 * MIB  # the level is now 1010 MiB, after the trim
    assert returner.after_batch() is False
    rss.value = 950 * MIB  # memory freed by itself lowers the level
    assert returner.after_batch() is False
    rss.value = 1050 * MIB
    assert returner.after_batch() is True and trim.calls == 2

    pool.lease(512 * KIB).release()  # an idle block above keep_idle_bytes: freed, and the heap trimmed with it
    rss.value = 1010 * MIB
    assert returner.after_batch() is True and trim.calls == 3
    assert returner.released_bytes == 512 * KIB and pool.stats().bytes_reserved == 0
    assert returner.trims == 3


def test_returner_refuses_bad_bounds(make_pool):
    with pytest.raises(ValueError, match="keep_idle_bytes = -1 must be >= 0"):
        MemoryReturner([], keep_idle_bytes=-1, trim_growth_bytes=1)
    with pytest.raises(ValueError, match="trim_growth_bytes = 0 >= 1"):
        MemoryReturner([], keep_idle_bytes=0, trim_growth_bytes=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim and /proc are Linux")
def test_malloc_trim_returns_freed_heap_pages_to_the_os():
    """Real glibc in a fresh process: 128 MiB of 64 KiB chunks (below the mmap threshold, so from the heap)
    freed behind one chunk still in use stay resident; release_freed_heap() gives at least 100 MiB back."""
    script = textwrap.dedent("""
        from fastpath.memory import release_freed_heap, resident_bytes
        chunks = [bytearray(64 * 1024) for _ in range(2048)]
        keep = bytearray(64 * 1024)  # allocated last: the heap's top cannot shrink below it
        before = resident_bytes()
        del chunks
        freed = resident_bytes()
        assert release_freed_heap()
        print(before, freed, resident_bytes())
    """)
    before, freed, trimmed = map(int, subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                                     text=True).stdout.split())
    assert before - freed < 16 * MIB  # free() alone kept the pages
    assert freed - trimmed >= 100 * MIB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_memory_reads_this_process_and_its_peak_resets():
    """Invariants: rss = anon + file + shmem (within a page or two of kernel rounding); the peak is >= the
    resident set, stays up after memory is freed, and comes back down to it after reset_peak_rss. Measured in
    a fresh interpreter: in a long test process glibc's raised mmap threshold keeps a freed block resident."""
    script = textwrap.dedent("""
        import numpy as np
        from fastpath.memory.reclaim import process_memory, reset_peak_rss, resident_bytes, release_freed_heap
        reset_peak_rss()
        block = np.ones(64 << 20, np.uint8)  # touched: 64 MiB resident
        grown = process_memory()
        del block
        after = process_memory()
        resident = resident_bytes()
        reset_peak_rss()
        reset = process_memory()
        print(grown.rss_bytes, grown.anon_bytes + grown.file_bytes + grown.shmem_bytes, grown.peak_rss_bytes,
              after.rss_bytes, after.peak_rss_bytes, resident, reset.peak_rss_bytes, int(release_freed_heap()))
    """)
    values = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout.split()
    grown_rss, grown_parts, grown_peak, after_rss, after_peak, resident, reset_peak, trimmed = map(int, values)
    assert abs(grown_rss - grown_parts) <= 64 * KIB
    assert grown_peak >= grown_rss and after_peak >= after_rss + 60 * MIB
    assert abs(resident - after_rss) < 8 * MIB
    assert reset_peak < after_rss + 8 * MIB
    assert trimmed == 1
