"""CUDA streams lent to graph runners and reused by the next runner once a runner closes.

torch keeps one cuBLAS workspace (32 MiB on sm90: ``CUBLAS_WORKSPACE_CONFIG``'s default 4096 KiB x 8) and one
cuBLASLt workspace per (cuBLAS handle, stream) in a process-wide map that nothing empties while a graph may
still point at them (``at::cuda::getCurrentCUDABlasHandle``; ``torch._C._cuda_clearCublasWorkspaces`` frees
every stream's, a live graph's included). A runner that made streams of its own left its workspaces behind at
close: each live model-version swap, which builds a new engine beside the serving one, added ~34 MiB of device
memory to the stub for good (docs/benchmarks/soak_gpu.md). Lending the closed runner's streams to the next
runner keeps the map's keys, and so that memory, bounded by the runners alive at once.

A pair is lent to one runner at a time: its replay stream and its capture stream, whose workspace the
runner's graphs embed. It goes back only after the runner's graphs are destroyed and its device work is done.
"""

from __future__ import annotations

import threading

import torch

_LOCK = threading.Lock()
_FREE: dict[int, list[tuple[torch.cuda.Stream, torch.cuda.Stream]]] = {}


def lease_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """A (replay, capture) stream pair on CUDA ``device`` (an index set): a returned pair if one is free, else
    two streams from torch's stream pool (so exclusive per pair object, not per CUDA stream: the pool cycles
    through 32 per device, far more than the 2-3 pairs a stub holds)."""
    with _LOCK:
        free = _FREE.get(device.index, [])
        if free:
            return free.pop()
    return torch.cuda.Stream(device), torch.cuda.Stream(device)


def return_streams(device: torch.device, pair: tuple[torch.cuda.Stream, torch.cuda.Stream]) -> None:
    """Give ``pair`` back for the next runner on ``device``. The caller's graphs captured on it are destroyed
    and its work on both streams is finished."""
    with _LOCK:
        _FREE.setdefault(device.index, []).append(pair)
