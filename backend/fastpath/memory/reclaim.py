"""Giving a process's memory back to the OS after a peak: idle pool blocks and the C heap's free pages.

A model that once served a large batch keeps, unless told otherwise, every byte it grew to: its
staging pool keeps idle blocks for the next batch, and glibc's malloc keeps freed chunks in its
arenas (one per thread that allocated) for the next ``malloc``. :class:`MemoryReturner` runs after
each batch and hands both back within configured bounds:

1. each pool frees idle blocks, largest first, beyond ``keep_idle_bytes``
   (:meth:`~fastpath.memory.pool.BlockPool.release_idle`);
2. ``malloc_trim(0)`` (glibc; every arena, free pages inside the heaps too) runs when step 1 freed a
   block, or when the resident set has grown by ``trim_growth_bytes`` since the level after the last
   trim. The growth rule limits the rate without a clock: each trim needs that much new growth, so
   memory that is legitimately in use never causes a trim per batch.

Measured effect and costs: docs/design/text_detection.md ("Memory").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence

from fastpath.memory.pool import BlockPool

LOG = logging.getLogger("fastpath.memory")
_STATUS_FIELDS = {"VmRSS": "rss_bytes", "VmHWM": "peak_rss_bytes", "RssAnon": "anon_bytes", "RssFile": "file_bytes",
                  "RssShmem": "shmem_bytes"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessMemory:
    """A process's memory as Linux counts it (``/proc/PID/status``), in bytes.

    Attributes:
        rss_bytes: resident set (``VmRSS``) = anon + file + shmem.
        peak_rss_bytes: the most it has been (``VmHWM``) since start or :func:`reset_peak_rss`.
        anon_bytes: private anonymous memory (``RssAnon``): the C heap, ONNX Runtime's buffers.
        file_bytes: mapped files (``RssFile``): libraries, the model file.
        shmem_bytes: shared memory (``RssShmem``): Triton's python-backend regions, mmap'd pool blocks.
    """

    rss_bytes: int
    peak_rss_bytes: int
    anon_bytes: int
    file_bytes: int
    shmem_bytes: int


def process_memory(pid: int | str = "self") -> ProcessMemory:
    """Read ``/proc/PID/status`` (Linux).

    Raises:
        OSError: no such process, or no ``/proc``.
    """
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in _STATUS_FIELDS:
                values[_STATUS_FIELDS[key]] = int(rest.split()[0]) * 1024  # the kernel reports kB
    return ProcessMemory(**values)


def reset_peak_rss(pid: int | str = "self") -> None:
    """Set ``VmHWM`` back to the current ``VmRSS`` (``/proc/PID/clear_refs``, value 5), so the next
    :func:`process_memory` reports the peak since now. Needs the right to write to that process's file.

    Raises:
        OSError: no such process, or not allowed.
    """
    with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def resident_bytes() -> int:
    """This process's resident set in bytes (``/proc/self/statm``: cheaper than ``status``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


def release_freed_heap() -> bool:
    """Return the C heap's free pages to the OS: glibc ``malloc_trim(0)``, every arena.

    Returns:
        True when it ran; False where the C library has no ``malloc_trim`` (musl, macOS).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class MemoryReturner:
    """After each batch: free idle pool blocks beyond a bound, and trim the C heap after growth.

    Args:
        pools: pools whose idle blocks beyond ``keep_idle_bytes`` (each) are freed.
        keep_idle_bytes: idle bytes each pool keeps for the next batches (>= 0).
        trim_growth_bytes: growth of the resident set above its level after the last trim that makes
            the next call trim (>= 1).
        read_rss: this process's resident bytes (injected in tests).
        trim: returns the C heap's free pages to the OS (injected in tests).

    Attributes:
        trims: trims that ran so far.
        released_bytes: pool bytes freed so far.

    Raises:
        ValueError: a negative ``keep_idle_bytes`` or a ``trim_growth_bytes`` below 1.
    """

    def __init__(self, pools: Sequence[BlockPool], *, keep_idle_bytes: int, trim_growth_bytes: int,
                 read_rss: Callable[[], int] = resident_bytes, trim: Callable[[], bool] = release_freed_heap) -> None:
        if keep_idle_bytes < 0 or trim_growth_bytes < 1:
            raise ValueError(f"keep_idle_bytes = {keep_idle_bytes} must be >= 0 and trim_growth_bytes = "
                             f"{trim_growth_bytes} >= 1")
        self.pools = tuple(pools)
        self.keep_idle_bytes = keep_idle_bytes
        self.trim_growth_bytes = trim_growth_bytes
        self._read_rss = read_rss
        self._trim = trim
        self._lock = threading.Lock()
        self._level_bytes = read_rss()
        self.trims = 0
        self.released_bytes = 0

    def after_batch(self) -> bool:
        """Release idle pool blocks beyond the bound, then trim if a block was freed or the resident
        set grew by ``trim_growth_bytes`` since the last trim. Returns True when it trimmed."""
        with self._lock:
            released = sum(pool.release_idle(self.keep_idle_bytes) for pool in self.pools)
            self.released_bytes += released
            rss = self._read_rss()
            if not released and rss - self._level_bytes < self.trim_growth_bytes:
                self._level_bytes = min(self._level_bytes, rss)  # memory freed by itself lowers the level
                return False
            if self._trim():
                self.trims += 1
            after = self._read_rss()
            LOG.debug("memory returned: %d pool bytes freed, resident %d -> %d bytes", released, rss, after)
            self._level_bytes = after
            return True
