"""CUDA runtime calls through cuda-python, the way TensorRT's samples make them.

``cuda-python`` returns ``(err, *results)`` tuples; :func:`cuda_call` turns a non-success status
into an :class:`~fastpath.errors.EngineError` naming the call (TensorRT ``samples/python/
common_runtime.py``). :class:`DeviceBuffer` and :class:`PinnedBuffer` own one allocation each and
free it in ``close`` (idempotent).
"""

from __future__ import annotations

from typing import Any

from fastpath.errors import EngineError


def cudart() -> Any:
    """The CUDA runtime module of cuda-python (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6).

    Raises:
        EngineError: cuda-python is not installed.
    """
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # cuda-python < 12.6
        except ImportError:
            raise EngineError("the TensorRT runtime needs cuda-python ('pip install cuda-python'); it is not installed") from None
    return runtime


def cuda_call(result: tuple) -> Any:
    """Check a cuda-python ``(err, *values)`` result and return the values.

    Returns:
        None, the single value, or a tuple of values.

    Raises:
        EngineError: the status is not ``cudaSuccess``; the message carries the error name.
    """
    err, *values = result
    runtime = cudart()
    if err != runtime.cudaError_t.cudaSuccess:
        _, name = runtime.cudaGetErrorName(err)
        raise EngineError(f"CUDA call failed: {name.decode() if isinstance(name, bytes) else name} ({int(err)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class DeviceBuffer:
    """``nbytes`` of device memory (``cudaMalloc``)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.ptr: int = int(cuda_call(cudart().cudaMalloc(nbytes)))

    def close(self) -> None:
        if self.ptr:
            cuda_call(cudart().cudaFree(self.ptr))
            self.ptr = 0


class PinnedBuffer:
    """``nbytes`` of page-locked host memory (``cudaMallocHost``) with a numpy view."""

    def __init__(self, nbytes: int) -> None:
        import ctypes

        import numpy as np

        self.nbytes = nbytes
        self.ptr: int = int(cuda_call(cudart().cudaMallocHost(nbytes)))
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.ptr))

    def close(self) -> None:
        if self.ptr:
            self.array = None
            cuda_call(cudart().cudaFreeHost(self.ptr))
            self.ptr = 0
