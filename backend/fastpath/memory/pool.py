"""A bounded, thread-safe pool of power-of-two blocks with free lists, leases and leak reports.

One class serves both sides: with a host allocator it is the pinned staging pool (leases give
numpy views), with :class:`~fastpath.memory.allocators.CudaDeviceAllocator` it is the device-side
buffer pool, so steady state does no cudaHostAlloc / cudaMalloc at all.

Policy (documented in docs/design/memory.md):
- a lease of n bytes takes a free block of class ``2**ceil(log2(n))`` (at least min_block_bytes),
  else allocates one if ``bytes_reserved + class <= capacity_bytes``, evicting idle blocks of other
  classes (largest first) to make room;
- otherwise it waits on a condition until a release, up to ``wait_timeout_s`` (pool clock);
- then it raises :class:`~fastpath.errors.UnavailableError` (retryable, HTTP 503), or, with
  ``fallback="pageable"``, serves the lease from ordinary memory within ``fallback_capacity_bytes``
  and counts it. Never an unbounded allocation, never a silently empty buffer.

Allocator calls happen outside the pool lock; the bytes are reserved first, so the bound holds.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

import numpy as np

from fastpath.errors import FastPathError, InvalidInputError, LeaseError, UnavailableError
from fastpath.memory.allocators import Allocator, Block, PageAlignedAllocator
from fastpath.memory.stats import LeakedLease, LeakReport, PoolConfig, PoolStats, capture_stack, format_stack

logger = logging.getLogger("fastpath.memory")

_TRACE_DEPTH = 8


class Lease:
    """The right to use one block until release; a context manager.

    Attributes:
        pool: the pool that granted it.
        nbytes: bytes requested (the usable size; views may not exceed it).
        block: the block held, or ``None`` for a zero-byte lease.
        lease_id: the pool's sequence number.
        fallback: True when served from pageable fallback memory.
    """

    __slots__ = ("pool", "nbytes", "block", "lease_id", "fallback", "taken_at_s", "stack", "released")

    def __init__(self, pool: BlockPool, nbytes: int, block: Block | None, lease_id: int, *, fallback: bool,
                 taken_at_s: float, stack: tuple[tuple[CodeType, int], ...] | None) -> None:
        self.pool = pool
        self.nbytes = nbytes
        self.block = block
        self.lease_id = lease_id
        self.fallback = fallback
        self.taken_at_s = taken_at_s
        self.stack = stack
        self.released = False

    @property
    def address(self) -> int:
        """Start address of the block (0 for a zero-byte lease)."""
        return self.block.address if self.block is not None else 0

    @property
    def block_bytes(self) -> int:
        """Size of the block held (its size class), 0 for a zero-byte lease."""
        return self.block.nbytes if self.block is not None else 0

    @property
    def pinned(self) -> bool:
        """True when the block is page-locked host memory."""
        return self.block is not None and self.block.pinned

    def view(self, dtype: np.dtype | type | str, shape: tuple[int, ...] | int, offset_bytes: int = 0) -> np.ndarray:
        """A writable numpy array of ``dtype`` and ``shape`` over the block, from ``offset_bytes``.

        The view is valid until the lease is released; using it afterwards reads memory that
        another lease may own. Blocks are page-aligned, so any dtype is aligned at offset 0.

        Raises:
            LeaseError: the lease was released, or it holds device memory (no host view).
            ValueError: object dtype, negative dimension, misaligned offset, or the view needs
                more than ``nbytes`` bytes.
        """
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(dim) for dim in shape)
        if self.released:
            raise LeaseError(f"lease #{self.lease_id} of pool {self.pool.name!r} was released; take a new lease")
        if dtype.hasobject:
            raise ValueError(f"dtype {dtype} holds Python objects and cannot live in raw pool memory")
        if any(dim < 0 for dim in shape):
            raise ValueError(f"shape {shape} has a negative dimension")
        count = math.prod(shape)  # exact Python ints (np.prod costs ~10 us per call in the staging hot path)
        needed = count * dtype.itemsize
        if offset_bytes < 0 or offset_bytes + needed > self.nbytes:
            raise ValueError(f"view {dtype}{list(shape)} at offset {offset_bytes} needs {offset_bytes + needed} bytes, "
                             f"lease #{self.lease_id} has {self.nbytes}")
        if needed == 0:
            return np.empty(shape, dtype=dtype)
        if self.block is None or self.block.array is None:
            raise LeaseError(f"lease #{self.lease_id} of pool {self.pool.name!r} holds device memory; it has no host view")
        if offset_bytes % dtype.alignment:
            raise ValueError(f"offset {offset_bytes} is not a multiple of {dtype}'s alignment {dtype.alignment}")
        return self.block.array[offset_bytes : offset_bytes + needed].view(dtype).reshape(shape)

    def kept(self, key: Any, make: Callable[[], Any], *, most: int = 64) -> Any:
        """``make()`` (views of the block: use them only while leased), kept with it under ``key`` till it is freed
        (past ``most`` keys, all go); a zero-byte or fallback lease keeps nothing."""
        kept = self.block.kept if self.block is not None and not self.fallback else {}  # a fallback block is freed at release
        if key not in kept:
            if len(kept) >= most:
                kept.clear()
            kept[key] = make()
        return kept[key]

    def release(self) -> None:
        """Return the block to the pool. Raises LeaseError when already released."""
        self.pool.release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.released:
            self.pool.release(self)

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<Lease #{self.lease_id} {self.nbytes} B in {self.block_bytes} B block of {self.pool.name!r}, {state}>"


class BlockPool:
    """Bounded pool of power-of-two blocks from one allocator; all methods are thread-safe.

    Args:
        allocator: where blocks come from (host pinned, host page-aligned, or device).
        config: limits and exhaustion policy.
        name: shown in stats, metrics, errors and leak reports (e.g. ``"host"``, ``"device"``).
        clock: monotonic seconds; injected so timeout tests need no sleeps.
        condition: the condition leases wait on; injected by tests (defaults to a new one).
        fallback_allocator: source of pageable fallback blocks (default: page-aligned mmap).
    """

    def __init__(self, allocator: Allocator, config: PoolConfig | None = None, *, name: str = "host",
                 clock: Callable[[], float] = time.monotonic, condition: threading.Condition | None = None,
                 fallback_allocator: Allocator | None = None) -> None:
        self.allocator = allocator
        self.config = config or PoolConfig()
        self.name = name
        self._clock = clock
        self._cond = condition or threading.Condition()
        self._fallback_allocator = fallback_allocator or PageAlignedAllocator()
        self._free: dict[int, list[Block]] = {size: [] for size in self.config.size_classes()}
        self._outstanding: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._counts = dict.fromkeys(
            ("leases", "releases", "hits", "misses", "waits", "exhausted", "fallbacks", "evictions"), 0)
        self._reserved = self._in_use = self._high_water = self._high_water_reserved = 0
        self._fallback_in_use = self._waiting = 0

    def size_class(self, nbytes: int) -> int:
        """Block size for a lease of ``nbytes`` (> 0) bytes.

        Raises:
            InvalidInputError: ``nbytes`` exceeds ``max_block_bytes`` (no wait could serve it).
        """
        if nbytes > self.config.max_block_bytes:
            raise InvalidInputError(
                f"{self.name} pool: a lease of {nbytes} bytes exceeds the largest block, max_block_bytes = "
                f"{self.config.max_block_bytes}; send a smaller batch or raise max_block_bytes"
            )
        return max(self.config.min_block_bytes, 1 << (int(nbytes) - 1).bit_length())

    def lease(self, nbytes: int, *, timeout_s: float | None = None) -> Lease:
        """Lease a block of at least ``nbytes`` bytes; use as a context manager or call ``release()``.

        Args:
            nbytes: bytes needed (>= 0; 0 gives a lease with no block and no allocation).
            timeout_s: how long to wait when exhausted (default ``config.wait_timeout_s``).

        Raises:
            ValueError: ``nbytes`` is negative.
            InvalidInputError: ``nbytes`` exceeds ``max_block_bytes``.
            UnavailableError: the pool is closed, or stayed exhausted for ``timeout_s`` (retry later).
        """
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"{self.name} pool: lease size {nbytes} bytes is negative")
        stack = capture_stack(_TRACE_DEPTH) if self.config.trace_leases else None
        if nbytes == 0:
            with self._cond:
                return self._grant(0, None, fallback=False, stack=stack)
        size = self.size_class(nbytes)
        lease, evicted, fallback = self._acquire(size, nbytes, self.config.wait_timeout_s if timeout_s is None else timeout_s, stack)
        if lease is not None:  # a free block's
            return lease
        for old in evicted:
            self.allocator.free(old)
        block = self._allocate(self._fallback_allocator if fallback else self.allocator, size, fallback)
        with self._cond:
            return self._grant(nbytes, block, fallback=fallback, stack=stack)

    def _acquire(self, size: int, nbytes: int, timeout_s: float,
                 stack: tuple[tuple[CodeType, int], ...] | None) -> tuple[Lease | None, list[Block], bool]:
        """Under the lock: lease a free block (a hit takes the lock once), or reserve room for a new one, or wait, or
        give up. Returns ``(lease or None, evicted blocks to free, fallback?)``; ``None`` means "allocate, then grant"."""
        with self._cond:
            deadline = None
            while True:
                self._check_open()
                if self._free[size]:
                    self._counts["hits"] += 1
                    return self._grant(nbytes, self._free[size].pop(), fallback=False, stack=stack), [], False
                evicted = self._reserve(size)
                if evicted is not None:
                    self._counts["misses"] += 1
                    return None, evicted, False
                now = self._clock()
                if deadline is None:
                    deadline = now + timeout_s
                    self._counts["waits"] += 1
                if now >= deadline:
                    return None, [], self._exhausted(size, nbytes, timeout_s)
                self._waiting += 1
                try:
                    self._cond.wait(deadline - now)
                finally:
                    self._waiting -= 1

    def _reserve(self, size: int) -> list[Block] | None:
        """Reserve ``size`` bytes, evicting idle blocks (largest first); None if they would not suffice."""
        over = self._reserved + size - self.config.capacity_bytes
        idle = sum(cls * len(blocks) for cls, blocks in self._free.items())
        if over > idle:
            return None
        evicted = []
        for cls in sorted(self._free, reverse=True):
            while over > 0 and self._free[cls]:
                evicted.append(self._free[cls].pop())
                over -= cls
                self._reserved -= cls
        self._counts["evictions"] += len(evicted)
        self._reserved += size
        self._high_water_reserved = max(self._high_water_reserved, self._reserved)
        return evicted

    def _exhausted(self, size: int, nbytes: int, timeout_s: float) -> bool:
        """Decide after a timed-out wait: True to serve from fallback memory, else raise."""
        config = self.config
        if config.fallback == "pageable" and self._fallback_in_use + size <= config.fallback_capacity_bytes:
            self._counts["fallbacks"] += 1
            self._fallback_in_use += size
            return True
        self._counts["exhausted"] += 1
        raise UnavailableError(
            f"{self.name} pool ({self.allocator.name}) exhausted: a lease of {nbytes} bytes (block {size}) "
            f"waited {timeout_s:g} s; capacity_bytes = {config.capacity_bytes}, {self._in_use} bytes in use by "
            f"{len(self._outstanding)} lease(s); retry later, or raise capacity_bytes / wait_timeout_s"
        )

    def _allocate(self, allocator: Allocator, size: int, fallback: bool) -> Block:
        """Allocate outside the lock; on failure give the reservation back and raise UnavailableError."""
        try:
            return allocator.allocate(size)
        except (MemoryError, OSError, FastPathError) as exc:
            with self._cond:
                if fallback:
                    self._fallback_in_use -= size
                else:
                    self._reserved -= size
                self._cond.notify_all()
            raise UnavailableError(
                f"{self.name} pool: {allocator.name} could not allocate {size} bytes ({exc}); retry later"
            ) from exc

    def _grant(self, nbytes: int, block: Block | None, *, fallback: bool, stack: tuple[tuple[CodeType, int], ...] | None) -> Lease:
        """A lease of ``block``, counted as outstanding; the caller holds the lock."""
        lease = Lease(self, nbytes, block, next(self._ids), fallback=fallback, taken_at_s=self._clock(), stack=stack)
        self._counts["leases"] += 1
        self._outstanding[lease.lease_id] = lease
        if block is not None and not fallback:
            self._in_use += block.nbytes
            self._high_water = max(self._high_water, self._in_use)
        return lease

    def release(self, lease: Lease) -> None:
        """Return ``lease``'s block to its free list and wake waiters. Raises LeaseError: the lease belongs to another
        pool, or was already released."""
        if lease.pool is not self:
            raise LeaseError(
                f"lease #{lease.lease_id} belongs to pool {lease.pool.name!r}, not {self.name!r}; release it to its own pool"
            )
        to_free = None
        with self._cond:
            if lease.released or self._outstanding.pop(lease.lease_id, None) is None:
                raise LeaseError(f"lease #{lease.lease_id} of pool {self.name!r} was already released")
            lease.released = True
            self._counts["releases"] += 1
            block = lease.block
            if block is not None and lease.fallback:
                self._fallback_in_use -= block.nbytes
                to_free = (self._fallback_allocator, block)
            elif block is not None:
                self._in_use -= block.nbytes
                if self._closed:
                    self._reserved -= block.nbytes
                    to_free = (self.allocator, block)
                else:
                    self._free[block.nbytes].append(block)
            if self._waiting:  # a waiter counts itself under the lock before it waits
                self._cond.notify_all()
        if to_free is not None:
            to_free[0].free(to_free[1])

    def release_idle(self, keep_bytes: int = 0) -> int:
        """Free idle blocks, largest first, until at most ``keep_bytes`` of idle blocks remain.

        Leased blocks are untouched. A later lease of a freed size allocates again (a miss), so
        ``keep_bytes`` trades resident memory for allocations: page-aligned blocks cost page faults
        on their next use, page-locked ones a ``cudaHostAlloc``.

        Returns:
            Bytes freed (block sizes), 0 when idle blocks already fit in ``keep_bytes``.
        """
        with self._cond:
            idle = sum(size * len(blocks) for size, blocks in self._free.items())
            freed: list[Block] = []
            for size in sorted(self._free, reverse=True):
                while idle > keep_bytes and self._free[size]:
                    freed.append(self._free[size].pop())
                    idle -= size
                    self._reserved -= size
        for block in freed:
            self.allocator.free(block)
        return sum(block.nbytes for block in freed)

    def stats(self) -> PoolStats:
        """A consistent snapshot of counters and gauges."""
        with self._cond:
            allocations = self.allocator.allocations + self._fallback_allocator.allocations
            frees = self.allocator.frees + self._fallback_allocator.frees
            return PoolStats(
                name=self.name, allocator=self.allocator.name, pinned=self.allocator.pinned,
                capacity_bytes=self.config.capacity_bytes, **self._counts, allocations=allocations, frees=frees,
                outstanding=len(self._outstanding), bytes_reserved=self._reserved, bytes_in_use=self._in_use,
                high_water_bytes=self._high_water, high_water_reserved_bytes=self._high_water_reserved,
                fallback_bytes_in_use=self._fallback_in_use, waiting=self._waiting,
            )

    def leak_report(self) -> LeakReport:
        """Every outstanding lease with where it was taken (also available before close)."""
        with self._cond:
            now = self._clock()
            leaks = tuple(
                LeakedLease(lease.lease_id, lease.nbytes, lease.block_bytes, now - lease.taken_at_s, format_stack(lease.stack))
                for lease in self._outstanding.values()
            )
        return LeakReport(self.name, leaks)

    def close(self) -> LeakReport:
        """Free idle blocks, refuse new leases, wake waiters, and report leases never released.

        Idempotent. Leaked blocks stay allocated (a view may still use them); blocks released
        later are freed at release. Each leak is logged as a warning with its stack.
        """
        with self._cond:
            first = not self._closed
            self._closed = True
            idle = [block for blocks in self._free.values() for block in blocks]
            for blocks in self._free.values():
                blocks.clear()
            self._reserved -= sum(block.nbytes for block in idle)
            self._cond.notify_all()
        for block in idle:
            self.allocator.free(block)
        self.allocator.release_deferred()
        report = self.leak_report()
        if first and not report.ok:
            logger.warning("%s", report)
        return report

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError(f"{self.name} pool is closed (model unloading); retry on another instance")

    def __enter__(self) -> BlockPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BlockPool {self.name!r} {self.allocator.name} capacity={self.config.capacity_bytes}>"
