"""Allocator choice and cuda_call on this machine (no CUDA device: the page-aligned allocator)."""

from __future__ import annotations

import logging

import pytest

from fastpath.memory import CudaError, PageAlignedAllocator, cuda_call, probe_cuda, select_host_allocator

needs_no_cuda = pytest.mark.skipif(probe_cuda().available, reason="a CUDA device is present; tests/gpu covers it")


@pytest.fixture
def cudart():
    return pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is not installed")


def test_page_aligned_blocks_are_aligned_writable_and_counted():
    allocator = PageAlignedAllocator()
    block = allocator.allocate(3 * 4096)
    assert block.address % 4096 == 0 and block.nbytes == 3 * 4096 and not block.pinned
    block.array[:] = 9
    assert int(block.array.sum()) == 9 * 3 * 4096
    allocator.free(block)
    assert (allocator.allocations, allocator.frees, block.array) == (1, 1, None)


@needs_no_cuda
def test_auto_choice_without_cuda_is_page_aligned_and_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="fastpath.memory"):
        allocator, reason = select_host_allocator("auto")
    assert allocator.name == "page-aligned" and not allocator.pinned
    assert "no CUDA device" in reason and probe_cuda().reason in reason
    assert "host staging allocator: page-aligned" in caplog.text


@needs_no_cuda
def test_requiring_pinned_memory_without_cuda_fails_clearly():
    with pytest.raises(RuntimeError, match="'cuda-pinned' was required but CUDA is unusable"):
        select_host_allocator("cuda-pinned")


def test_unknown_allocator_is_refused():
    with pytest.raises(ValueError, match="host allocator 'hugepages' is unknown"):
        select_host_allocator("hugepages")


def test_cuda_call_unwraps_results(cudart):
    ok = cudart.cudaError_t.cudaSuccess
    assert cuda_call((ok,)) is None
    assert cuda_call((ok, 5)) == 5
    assert cuda_call((ok, 1, 2)) == (1, 2)


def test_cuda_call_raises_with_the_cuda_error_name(cudart):
    with pytest.raises(CudaError, match=r"cudaMalloc\(64 bytes\): CUDA error cudaErrorMemoryAllocation \(2\): out of memory") as info:
        cuda_call((cudart.cudaError_t.cudaErrorMemoryAllocation, None), "cudaMalloc(64 bytes)")
    assert info.value.error_name == "cudaErrorMemoryAllocation"


@needs_no_cuda
def test_cuda_call_on_a_real_failing_runtime_call(cudart):
    with pytest.raises(CudaError, match="cudaGetDeviceCount: CUDA error cudaError"):
        cuda_call(cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
    assert probe_cuda().available is False and probe_cuda().device_count == 0


@needs_no_cuda
def test_timed_copy_without_a_driver_enqueues_nothing_so_callers_use_cuda_python():
    """Invariant: where no CUDA driver answers, enqueue_timed_copy answers False without touching memory
    or raising, and the engine then takes its cuda-python path (whose errors name the missing device)."""
    import numpy as np

    from fastpath.memory.cuda import enqueue_timed_copy

    source, target = np.arange(64, dtype=np.uint8), np.zeros(64, np.uint8)
    assert enqueue_timed_copy(0, 0, target.ctypes.data, source.ctypes.data, 64, 0) is False
    assert not target.any()


def test_driver_errors_name_the_call_and_the_cuda_result():
    """Invariant: a failed driver call through ctypes raises CudaError naming the call and the CUresult."""
    from fastpath.memory.cuda import _driver_check

    _driver_check(0, "cuEventRecord(start)")  # CUDA_SUCCESS: no error
    with pytest.raises(CudaError, match=r"cuMemcpyAsync\(64 bytes\): CUDA error .*\(1\)") as info:
        _driver_check(1, "cuMemcpyAsync(64 bytes)")
    assert info.value.call == "cuMemcpyAsync(64 bytes)"
    assert info.value.error_name in ("CUDA_ERROR_INVALID_VALUE", "CUresult 1")
