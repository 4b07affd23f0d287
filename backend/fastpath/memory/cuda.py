"""cuda-python (``cuda.bindings``) access: one status check, and a probe for a usable CUDA device.

Every cuda-python runtime call returns a tuple ``(err, *results)``. :func:`cuda_call` turns a
non-success ``err`` into a :class:`CudaError` and unwraps the results, as ``cuda_call()`` in the
TensorRT samples' ``samples/python/common_runtime.py`` does, so no status is ever dropped.

``cuda.bindings`` is imported lazily: FastPath runs without it (CPU-only machines), and
:func:`probe_cuda` says why CUDA is not used instead of failing.

:func:`enqueue_timed_copy` is the one place that calls the driver library through ``ctypes`` instead: its
three calls must not give up the GIL between them (why: its docstring).
"""

from __future__ import annotations

import ctypes
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


_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2  # cuda.h CUpointer_attribute; answers CU_MEMORYTYPE_HOST (1) for page-locked
_CU_MEMORYTYPE_HOST, _CU_MEMORYTYPE_DEVICE = 1, 2  # host memory, CU_MEMORYTYPE_DEVICE for device memory


@functools.lru_cache(maxsize=1)
def _driver_holding_gil() -> ctypes.PyDLL | None:
    """``libcuda.so.1`` through ``ctypes.PyDLL``, whose calls keep the GIL (``ctypes.CDLL`` and cuda-python
    release it around every call); None where the driver library is not loadable (no NVIDIA driver)."""
    try:
        driver = ctypes.PyDLL("libcuda.so.1")
    except OSError:
        return None
    driver.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    driver.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    driver.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    for function in (driver.cuEventRecord, driver.cuMemcpyAsync, driver.cuPointerGetAttribute):
        function.restype = ctypes.c_int
    return driver


def _driver_check(status: int, call: str) -> None:
    """:func:`check` for a raw ``CUresult`` code from the ctypes calls (as ``cuda.bindings.driver.CUresult``, so the
    error names it, where the bindings know the code)."""
    if status == 0:
        return
    try:
        from cuda.bindings import driver

        err: Any = driver.CUresult(status)
    except Exception:  # noqa: BLE001 - an unknown code is still reported, by its number
        err = status
    check(err, call)


def _page_locked_or_device(driver: ctypes.PyDLL, address: int) -> bool:
    """Whether the driver knows ``address`` as page-locked host or device memory (pageable memory: an error)."""
    memory_type = ctypes.c_uint(0)
    status = driver.cuPointerGetAttribute(ctypes.byref(memory_type), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address)
    return status == 0 and memory_type.value in (_CU_MEMORYTYPE_HOST, _CU_MEMORYTYPE_DEVICE)


def enqueue_timed_copy(start: Any, end: Any, dst: int, src: int, nbytes: int, stream: Any) -> bool:
    """Record ``start``, enqueue an async copy of ``nbytes`` from ``src`` to ``dst``, record ``end`` on ``stream``,
    without giving up the GIL between the three calls; False, enqueuing nothing, where that cannot be done.

    cuda-python releases the GIL around each call: in a busy stub the thread then waits for it (up to the
    5 ms switch interval) between ``start``, stamped at once on an idle stream, and the copy, so the events
    time the wait as copy time and the copy starts late (docs/benchmarks/h2d_contention_h100.md). Refused:
    no driver library, or pageable memory on either side (an async copy from it is synchronous, and holding
    the GIL through it would stall every other thread). ``start``/``end``: CUDA events; ``dst``/``src``:
    unified addresses; ``stream``: a stream of the calling thread's current context (``int()`` gives each
    handle).

    Raises:
        CudaError: the driver refused a call (the copy and ``end`` may not have been enqueued).
    """
    driver = _driver_holding_gil()
    if driver is None or not (_page_locked_or_device(driver, src) and _page_locked_or_device(driver, dst)):
        return False
    stream_handle = int(stream)
    _driver_check(driver.cuEventRecord(int(start), stream_handle), "cuEventRecord(start)")
    _driver_check(driver.cuMemcpyAsync(dst, src, nbytes, stream_handle), f"cuMemcpyAsync({nbytes} bytes)")
    _driver_check(driver.cuEventRecord(int(end), stream_handle), "cuEventRecord(end)")
    return True
