"""Raw block allocators behind the pools: CUDA page-locked host, page-aligned host, CUDA device.

An allocator hands out :class:`Block` objects and counts every allocation and free, so a
benchmark can prove that steady state allocates nothing. Which host allocator a pool uses is
chosen once by :func:`select_host_allocator` and reported (log line, pool statistics, metrics).

- :class:`CudaPinnedAllocator`: ``cudaHostAlloc`` / ``cudaFreeHost`` (page-locked, portable), the
  memory the GPU's copy engines read by DMA at full PCIe/C2C speed.
- :class:`PageAlignedAllocator`: anonymous ``mmap`` (page-aligned ordinary memory) for machines
  without CUDA, and for the counted pageable fallback of an exhausted pool.
- :class:`CudaDeviceAllocator`: ``cudaMalloc`` / ``cudaFree`` for the device-side buffer pool.

Host blocks never free memory that a numpy view still points to: a free while views are alive is
deferred (counted) and retried on the next free or :meth:`Allocator.release_deferred`.
"""

from __future__ import annotations

import abc
import ctypes
import dataclasses
import logging
import mmap
import sys
import threading
from typing import Any

import numpy as np

from fastpath.memory.cuda import CAPTURE_LOCK, cuda_call, probe_cuda, runtime

logger = logging.getLogger("fastpath.memory")

HOST_ALLOCATORS = ("auto", "cuda-pinned", "page-aligned")


@dataclasses.dataclass(eq=False)
class Block:
    """One allocation.

    Attributes:
        address: start address (host pointer, or device pointer for device blocks).
        nbytes: size in bytes.
        array: uint8 numpy array over the whole block (host blocks), else ``None``.
        pinned: True for page-locked host memory.
        handle: allocator-private owner of the memory (an ``mmap``), or ``None``.
        kept: objects made from the block's memory (views) that its leases keep for the next lease
            (:meth:`~fastpath.memory.pool.Lease.kept`); emptied when the block is freed.
    """

    address: int
    nbytes: int
    array: np.ndarray | None
    pinned: bool
    handle: Any = None
    kept: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False)


class Allocator(abc.ABC):
    """Allocates and frees :class:`Block` objects, counting both; thread-safe.

    Attributes:
        name: what the allocator is, as reported in logs and metrics.
        pinned: True when host blocks are page-locked.
        allocations: blocks allocated so far.
        frees: blocks actually freed so far.
        deferred_frees: frees postponed because numpy views of the block were still alive.
    """

    name = "allocator"
    pinned = False

    def __init__(self) -> None:
        self.allocations = 0
        self.frees = 0
        self.deferred_frees = 0
        self._lock = threading.Lock()
        self._deferred: list[Block] = []

    def allocate(self, nbytes: int) -> Block:
        """Allocate a block of ``nbytes`` (> 0) bytes.

        Raises:
            MemoryError / CudaError: the system or the device has no memory left.
        """
        block = self._allocate(nbytes)
        with self._lock:
            self.allocations += 1
        return block

    def free(self, block: Block) -> None:
        """Free ``block`` now, or later if numpy views of it are still alive (those its leases kept go first)."""
        block.kept.clear()
        self.release_deferred()
        if self._views_alive(block):
            with self._lock:
                self.deferred_frees += 1
                self._deferred.append(block)
            return
        self._free_now(block)

    def release_deferred(self) -> int:
        """Free deferred blocks whose views are gone; return how many are still deferred."""
        with self._lock:
            pending, self._deferred = self._deferred, []
        still = [block for block in pending if self._views_alive(block)]
        for block in pending:
            if block not in still:
                self._free_now(block)
        with self._lock:
            self._deferred.extend(still)
            return len(self._deferred)

    def _free_now(self, block: Block) -> None:
        self._free(block)
        block.array = None
        with self._lock:
            self.frees += 1

    @staticmethod
    def _views_alive(block: Block) -> bool:
        # Views of block.array keep it as their numpy base; baseline references are the block's
        # attribute and getrefcount's own argument. CPython-specific by design.
        return block.array is not None and sys.getrefcount(block.array) > 2

    @abc.abstractmethod
    def _allocate(self, nbytes: int) -> Block: ...

    @abc.abstractmethod
    def _free(self, block: Block) -> None: ...


class PageAlignedAllocator(Allocator):
    """Ordinary (pageable) host memory from anonymous ``mmap``: page-aligned, zero-filled by the OS."""

    name = "page-aligned"
    pinned = False

    def _allocate(self, nbytes: int) -> Block:
        memory = mmap.mmap(-1, nbytes)
        array = np.frombuffer(memory, dtype=np.uint8)
        return Block(address=int(array.ctypes.data), nbytes=nbytes, array=array, pinned=False, handle=memory)

    def _free(self, block: Block) -> None:
        block.array = None
        try:
            block.handle.close()
        except BufferError:  # an exported buffer is still alive: the OS frees it with that object
            pass


def _host_array(address: int, nbytes: int) -> np.ndarray:
    """A writable uint8 numpy array over ``nbytes`` of host memory at ``address``."""
    return np.frombuffer((ctypes.c_ubyte * nbytes).from_address(address), dtype=np.uint8)


class CudaPinnedAllocator(Allocator):
    """Page-locked host memory: ``cudaHostAlloc(nbytes, cudaHostAllocPortable)`` / ``cudaFreeHost``.

    Portable so that every CUDA context of the process sees the memory as pinned.

    Args:
        device: the CUDA device whose context allocates and frees the blocks (``cudaSetDevice`` first,
            in the calling thread): the device the model instance's engine runs on, so that a
            process serving from GPU 1 creates no context on GPU 0 (a thread's current device is
            0 until set). None: the calling thread's current device.
    """

    name = "cuda-pinned"
    pinned = True

    def __init__(self, device: int | None = None) -> None:
        super().__init__()
        self.device = device

    def _select_device(self) -> None:
        if self.device is not None:
            cuda_call(runtime().cudaSetDevice(self.device), f"cudaSetDevice({self.device})")

    def _allocate(self, nbytes: int) -> Block:
        cudart = runtime()
        with CAPTURE_LOCK:  # never while a graph is being captured (memory/cuda.py)
            self._select_device()
            address = int(cuda_call(cudart.cudaHostAlloc(nbytes, cudart.cudaHostAllocPortable), f"cudaHostAlloc({nbytes} bytes)"))
        return Block(address=address, nbytes=nbytes, array=_host_array(address, nbytes), pinned=True)

    def _free(self, block: Block) -> None:
        block.array = None
        with CAPTURE_LOCK:
            self._select_device()
            cuda_call(runtime().cudaFreeHost(block.address), f"cudaFreeHost({block.nbytes} bytes)")


class CudaDeviceAllocator(Allocator):
    """Device memory on ``device``: ``cudaMalloc`` / ``cudaFree`` (256-byte aligned).

    Args:
        device: CUDA device ordinal.
    """

    name = "cuda-device"
    pinned = False

    def __init__(self, device: int = 0) -> None:
        super().__init__()
        self.device = device

    def _allocate(self, nbytes: int) -> Block:
        cudart = runtime()
        with CAPTURE_LOCK:  # never while a graph is being captured (memory/cuda.py)
            cuda_call(cudart.cudaSetDevice(self.device), f"cudaSetDevice({self.device})")
            address = int(cuda_call(cudart.cudaMalloc(nbytes), f"cudaMalloc({nbytes} bytes) on device {self.device}"))
        return Block(address=address, nbytes=nbytes, array=None, pinned=False)

    def _free(self, block: Block) -> None:
        cudart = runtime()
        with CAPTURE_LOCK:
            cuda_call(cudart.cudaSetDevice(self.device), f"cudaSetDevice({self.device})")
            cuda_call(cudart.cudaFree(block.address), f"cudaFree({block.nbytes} bytes)")


def select_host_allocator(preference: str = "auto", device: int | None = None) -> tuple[Allocator, str]:
    """Choose the host allocator: CUDA page-locked when a device is present, else page-aligned.

    Args:
        preference: ``"auto"``, ``"cuda-pinned"`` (required: error without CUDA) or ``"page-aligned"``.
        device: the CUDA device ordinal page-locked blocks are allocated from (:class:`CudaPinnedAllocator`).

    Returns:
        ``(allocator, reason)``; the reason is also logged at INFO on logger ``fastpath.memory``.

    Raises:
        ValueError: unknown preference.
        RuntimeError: ``"cuda-pinned"`` was required but no CUDA device is usable.
    """
    if preference not in HOST_ALLOCATORS:
        raise ValueError(f"host allocator {preference!r} is unknown; choose one of {', '.join(HOST_ALLOCATORS)}")
    probe = probe_cuda() if preference != "page-aligned" else None
    if probe is not None and probe.available:
        allocator: Allocator = CudaPinnedAllocator(device)
        where = "" if device is None else f", allocated from device {device}"
        reason = f"cudaHostAlloc page-locked memory ({probe.reason}{where})"
    elif preference == "cuda-pinned":
        raise RuntimeError(f"host allocator 'cuda-pinned' was required but CUDA is unusable: {probe.reason if probe else ''}")
    else:
        allocator = PageAlignedAllocator()
        why = "requested" if probe is None else f"no CUDA device: {probe.reason}"
        reason = f"page-aligned mmap memory ({why})"
    logger.info("host staging allocator: %s, %s", allocator.name, reason)
    return allocator, reason
