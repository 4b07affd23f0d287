"""cuda-python (``cuda.bindings``) access: one status check, and a probe for a usable CUDA device.

Every cuda-python runtime call returns a tuple ``(err, *results)``. :func:`cuda_call` turns a
non-success ``err`` into a :class:`CudaError` and unwraps the results, as ``cuda_call()`` in the
TensorRT samples' ``samples/python/common_runtime.py`` does, so no status is ever dropped.

``cuda.bindings`` is imported lazily: FastPath runs without it (CPU-only machines), and
:func:`probe_cuda` says why CUDA is not used instead of failing.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any

from fastpath.errors import CudaError

# CUDA forbids "unsafe" API calls (cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost, ...) from any thread of the
# process while a stream captures a graph in cudaStreamCaptureModeGlobal, which ONNX Runtime's CUDA EP uses: such a
# call invalidates the capture and the graph later faults (cudaErrorIllegalAddress, seen on the H200 when a staging
# block was allocated while text_detection captured a new shape). FastPath's CUDA allocators and graph captures
# hold this lock, so the two never overlap.
CAPTURE_LOCK = threading.RLock()


@functools.lru_cache(maxsize=1)
def runtime() -> Any:
    """The ``cuda.bindings.runtime`` module (CUDA runtime API).

    Raises:
        ImportError: cuda-python is not installed (``pip install cuda-bindings``).
    """
    from cuda.bindings import runtime as cudart

    return cudart


def _error_text(err: Any) -> tuple[str, str]:
    """(name, description) of a ``cudaError_t`` via cudaGetErrorName / cudaGetErrorString."""
    cudart = runtime()
    name = getattr(err, "name", str(err))
    try:
        status, text = cudart.cudaGetErrorString(err)
        description = text.decode() if status == cudart.cudaError_t.cudaSuccess else ""
    except Exception:  # noqa: BLE001 - describing an error must not raise a second one
        description = ""
    return name, description


def check(err: Any, call: str = "") -> None:
    """Raise :class:`CudaError` unless ``err`` is ``cudaSuccess`` (or ``CUDA_SUCCESS``).

    Args:
        err: a ``cudaError_t`` (runtime API) or ``CUresult`` (driver API) status.
        call: what was being done; it leads the message.

    Raises:
        CudaError: naming the call, the CUDA error name and its description.
    """
    if int(err) == 0:  # cudaSuccess and CUDA_SUCCESS are both 0
        return
    name, description = _error_text(err)
    where = f"{call}: " if call else ""
    raise CudaError(
        f"{where}CUDA error {name} ({int(err)}): {description or 'no description'}; "
        "check the device is present and has free memory (nvidia-smi)",
        error_name=name,
        call=call,
    )


def cuda_call(result: tuple[Any, ...], call: str = "") -> Any:
    """Check a cuda-python ``(err, *results)`` tuple and return the results.

    Args:
        result: what a ``cuda.bindings`` function returned.
        call: what was being done, for the error message.

    Returns:
        ``None`` for no results, the single result for one, else a tuple of results.

    Raises:
        CudaError: ``err`` is not success.
    """
    err, *values = result
    check(err, call)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclasses.dataclass(frozen=True)
class CudaProbe:
    """Whether a CUDA device can be used, and why not.

    Attributes:
        available: True when cuda.bindings imports and at least one device answers.
        device_count: devices the runtime sees (0 when unavailable).
        device_name: name of device 0, e.g. ``"NVIDIA H200"`` ("" when unavailable).
        reason: one line saying what was found, for logs and test skips.
    """

    available: bool
    device_count: int
    device_name: str
    reason: str


@functools.lru_cache(maxsize=1)
def probe_cuda() -> CudaProbe:
    """Probe for a CUDA device once per process (cudaGetDeviceCount, cudaGetDeviceProperties).

    Never raises: a missing package, driver or device gives ``available=False`` with the reason.
    """
    try:
        cudart = runtime()
    except ImportError as exc:
        return CudaProbe(False, 0, "", f"cuda.bindings is not importable ({exc}); install cuda-bindings")
    try:
        err, count = cudart.cudaGetDeviceCount()
    except Exception as exc:  # noqa: BLE001 - e.g. libcudart missing: report, never raise
        return CudaProbe(False, 0, "", f"cudaGetDeviceCount failed: {type(exc).__name__}: {exc}")
    if int(err) != 0:
        name, description = _error_text(err)
        return CudaProbe(False, 0, "", f"cudaGetDeviceCount returned {name}: {description}")
    if count == 0:
        return CudaProbe(False, 0, "", "cudaGetDeviceCount found 0 CUDA devices")
    err, props = cudart.cudaGetDeviceProperties(0)
    raw_name = props.name if int(err) == 0 else b"unknown"
    device_name = (raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)).rstrip("\x00")
    return CudaProbe(True, int(count), device_name, f"{count} CUDA device(s), device 0: {device_name}")


def use_blocking_sync(device_id: int) -> None:
    """Make host threads of this process sleep, not spin, while they wait for device ``device_id``
    (``cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)``: stream, event and device synchronizes).

    CUDA's default (``cudaDeviceScheduleAuto``) busy-waits while the process has fewer active contexts
    than cores: each wait then holds a core for as long as the GPU computes. Process-wide for the device;
    applies to its primary context whether or not that is active yet.

    Raises:
        CudaError: the runtime refuses the device or the flag.
    """
    cudart = runtime()
    cuda_call(cudart.cudaSetDevice(device_id), "cudaSetDevice")
    cuda_call(cudart.cudaSetDeviceFlags(cudart.cudaDeviceScheduleBlockingSync), "cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)")
