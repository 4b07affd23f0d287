"""FastPath memory: the one owner of pinned host and device buffers, and of ``cuda_call``.

Entry points:
- :func:`create_host_pool`: the host staging pool; CUDA page-locked memory (``cudaHostAlloc``)
  when a CUDA device is present, page-aligned ordinary memory otherwise (chosen and logged).
- :func:`~fastpath.memory.staging.stage`: copy a batch input's request tensors into one block.
- :class:`CudaPinnedAllocator` / :class:`CudaDeviceAllocator`: single page-locked host and device
  allocations for buffers an engine keeps for its lifetime (the TensorRT runtime's).
- :func:`cuda_call`: every cuda-python status checked in one place (:class:`CudaError`).
- :class:`~fastpath.memory.reclaim.MemoryReturner`: after each batch, idle pool blocks beyond a bound
  and the C heap's free pages go back to the OS.

See docs/design/memory.md for the policies and the H200 measurements.
"""

from __future__ import annotations

from fastpath.errors import CudaError, LeaseError
from fastpath.memory.allocators import (
    Allocator,
    Block,
    CudaDeviceAllocator,
    CudaPinnedAllocator,
    PageAlignedAllocator,
    select_host_allocator,
)
from fastpath.memory.cuda import CudaProbe, cuda_call, probe_cuda
from fastpath.memory.pool import BlockPool, Lease
from fastpath.memory.reclaim import (
    MemoryReturner,
    ProcessMemory,
    process_memory,
    release_freed_heap,
    reset_peak_rss,
    resident_bytes,
)
from fastpath.memory.staging import ParallelCopier, StagedTensor, stage
from fastpath.memory.stats import LeakedLease, LeakReport, PoolConfig, PoolStats


def cuda_ordinal(device: str | None) -> int | None:
    """The CUDA device ordinal of a torch-style device string: ``"cuda:1"`` -> 1; None for
    ``"cuda"`` (the current device), ``"cpu"`` and None.

    Raises:
        ValueError: ``cuda:`` followed by something other than a non-negative integer.
    """
    if not device or not device.startswith("cuda:"):
        return None
    index = device.partition(":")[2]
    if not index.isdigit():
        raise ValueError(f"device {device!r}: expected cpu, cuda or cuda:N with N a GPU ordinal")
    return int(index)


def create_host_pool(config: PoolConfig | None = None, *, allocator: str = "auto", name: str = "host",
                     device: str | None = None) -> BlockPool:
    """The host staging pool with an automatically chosen allocator.

    Args:
        config: limits and exhaustion policy (defaults: 1 GiB capacity, 4 KiB..512 MiB blocks,
            1 s wait, then UnavailableError).
        allocator: ``"auto"`` (CUDA page-locked if a device is present, else page-aligned),
            ``"cuda-pinned"`` or ``"page-aligned"``.
        name: pool name in stats, metrics and errors.
        device: the engine's device (``cpu``, ``cuda``, ``cuda:N``); page-locked blocks of a
            ``cuda:N`` engine are allocated from device N's context (the memory itself is usable
            from every device).

    Raises:
        RuntimeError: ``allocator="cuda-pinned"`` without a usable CUDA device.
        ValueError: ``device`` is not ``cpu``, ``cuda`` or ``cuda:N``.
    """
    chosen, _reason = select_host_allocator(allocator, cuda_ordinal(device))
    return BlockPool(chosen, config, name=name)


__all__ = [
    "Allocator",
    "Block",
    "BlockPool",
    "CudaDeviceAllocator",
    "CudaError",
    "CudaPinnedAllocator",
    "CudaProbe",
    "LeakReport",
    "LeakedLease",
    "Lease",
    "LeaseError",
    "MemoryReturner",
    "PageAlignedAllocator",
    "ParallelCopier",
    "PoolConfig",
    "PoolStats",
    "ProcessMemory",
    "StagedTensor",
    "create_host_pool",
    "cuda_ordinal",
    "cuda_call",
    "probe_cuda",
    "process_memory",
    "release_freed_heap",
    "reset_peak_rss",
    "resident_bytes",
    "select_host_allocator",
    "stage",
]
