"""FastPath memory: a bounded pinned host staging pool, a device buffer pool, and the CUDA batch transfer path.

Entry points:
- :func:`create_host_pool`: the host staging pool; CUDA page-locked memory (``cudaHostAlloc``)
  when a CUDA device is present, page-aligned ordinary memory otherwise (chosen and logged).
- :func:`~fastpath.memory.staging.stage`: copy a batch input's request tensors into one block.
- :func:`~fastpath.memory.transfer.create_transfer_path` (CUDA only): one H2D copy per input per
  batch on a stream, outputs D2H into pinned blocks, events for completion, pooled device buffers.

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
from fastpath.memory.staging import ParallelCopier, StagedTensor, stage
from fastpath.memory.stats import LeakedLease, LeakReport, PoolConfig, PoolStats


def create_host_pool(config: PoolConfig | None = None, *, allocator: str = "auto", name: str = "host") -> BlockPool:
    """The host staging pool with an automatically chosen allocator.

    Args:
        config: limits and exhaustion policy (defaults: 1 GiB capacity, 4 KiB..512 MiB blocks,
            1 s wait, then UnavailableError).
        allocator: ``"auto"`` (CUDA page-locked if a device is present, else page-aligned),
            ``"cuda-pinned"`` or ``"page-aligned"``.
        name: pool name in stats, metrics and errors.

    Raises:
        RuntimeError: ``allocator="cuda-pinned"`` without a usable CUDA device.
    """
    chosen, _reason = select_host_allocator(allocator)
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
    "PageAlignedAllocator",
    "ParallelCopier",
    "PoolConfig",
    "PoolStats",
    "StagedTensor",
    "create_host_pool",
    "cuda_call",
    "probe_cuda",
    "select_host_allocator",
    "stage",
]
