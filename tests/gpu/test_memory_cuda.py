"""The CUDA allocators and pools on a real device (skipped without CUDA, saying why)."""

from __future__ import annotations

import numpy as np
import pytest

from fastpath.errors import UnavailableError
from fastpath.memory import BlockPool, CudaDeviceAllocator, CudaError, PoolConfig, create_host_pool, cuda_call, probe_cuda

PROBE = probe_cuda()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not PROBE.available, reason=f"no CUDA device: {PROBE.reason}")]
MIB = 1 << 20


@pytest.fixture
def cudart():
    from cuda.bindings import runtime

    return runtime


def test_auto_host_pool_is_page_locked_cuda_memory(cudart):
    pool = create_host_pool(PoolConfig(capacity_bytes=16 * MIB, max_block_bytes=16 * MIB))
    with pool.lease(3 * MIB) as lease:
        attributes = cuda_call(cudart.cudaPointerGetAttributes(lease.address))
        assert attributes.type == cudart.cudaMemoryType.cudaMemoryTypeHost
        assert lease.pinned and lease.address % 4096 == 0
        view = lease.view(np.float16, (3, MIB // 2))
        view[:] = 1.5
        assert float(view.astype(np.float32).sum()) == 1.5 * 3 * MIB // 2
        del view  # a live view would (rightly) defer the free
    stats = pool.stats()
    assert (stats.allocator, stats.pinned, stats.allocations) == ("cuda-pinned", True, 1)
    assert pool.close().ok and pool.stats().frees == 1


def test_pinned_free_waits_for_live_views():
    pool = create_host_pool(PoolConfig(capacity_bytes=16 * MIB, max_block_bytes=16 * MIB))
    with pool.lease(4096) as lease:
        kept = lease.view(np.int32, (4,))
        kept[:] = [1, 2, 3, 4]
    pool.close()
    assert pool.allocator.deferred_frees == 1 and kept.tolist() == [1, 2, 3, 4]
    del kept
    assert pool.allocator.release_deferred() == 0 and pool.allocator.frees == 1


def test_device_pool_exhaustion_is_retryable_not_a_crash(cudart):
    """Invariant: a device pool at its capacity answers a further lease with UnavailableError (retryable,
    HTTP 503), and every block goes back to the device on close."""
    device = BlockPool(CudaDeviceAllocator(0), PoolConfig(capacity_bytes=4 * MIB, max_block_bytes=4 * MIB, wait_timeout_s=0.0), name="device")
    with device.lease(4 * MIB) as lease:  # fills the device pool
        attributes = cuda_call(cudart.cudaPointerGetAttributes(lease.address))
        assert attributes.type == cudart.cudaMemoryType.cudaMemoryTypeDevice
        with pytest.raises(UnavailableError, match="device pool .* exhausted"):
            device.lease(64)
    assert device.close().ok and device.allocator.frees == device.allocator.allocations == 1


def test_cuda_call_raises_on_a_real_failure(cudart):
    with pytest.raises(CudaError, match="cudaErrorInvalidDevice") as info:
        cuda_call(cudart.cudaSetDevice(10_000), "cudaSetDevice(10000)")
    assert info.value.call == "cudaSetDevice(10000)"


def test_blocking_sync_sets_the_devices_schedule_flag_even_after_its_context_is_active():
    """use_blocking_sync leaves cudaDeviceScheduleBlockingSync in the device's flags, here after an allocation made
    the primary context active (process-wide: run in a child process of its own)."""
    import os
    import subprocess
    import sys

    code = ("from fastpath.memory.cuda import runtime, cuda_call, use_blocking_sync\n"
            "r = runtime(); cuda_call(r.cudaSetDevice(0)); cuda_call(r.cudaFree(0))\n"
            "use_blocking_sync(0)\n"
            "flags = cuda_call(r.cudaGetDeviceFlags())\n"
            "print(int(flags) & int(r.cudaDeviceScheduleMask), int(r.cudaDeviceScheduleBlockingSync))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # the backend as this process imports it
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=env)
    schedule, blocking = done.stdout.split()
    assert schedule == blocking


def test_timed_copy_holding_the_gil_moves_the_bytes_and_times_them(cudart):
    """Invariant: enqueue_timed_copy copies page-locked host memory to the device and back byte for byte,
    between two events that elapse a positive time, and refuses pageable memory (False, nothing enqueued)."""
    from fastpath.memory.cuda import enqueue_timed_copy

    cuda_call(cudart.cudaSetDevice(0))
    stream = cuda_call(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking))
    start, end = (cuda_call(cudart.cudaEventCreate()) for _ in range(2))
    pool = create_host_pool(PoolConfig(capacity_bytes=16 * MIB, max_block_bytes=16 * MIB))
    device = BlockPool(CudaDeviceAllocator(0), PoolConfig(capacity_bytes=4 * MIB, max_block_bytes=4 * MIB), name="device")
    try:
        with pool.lease(4 * MIB) as source, pool.lease(4 * MIB) as back, device.lease(4 * MIB) as on_device:
            sent = source.view(np.uint8, (4 * MIB,))
            sent[:] = np.arange(4 * MIB, dtype=np.uint64).astype(np.uint8) ^ 0x5A
            received = back.view(np.uint8, (4 * MIB,))
            received[:] = 0
            assert enqueue_timed_copy(start, end, on_device.address, source.address, 4 * MIB, stream)
            cuda_call(cudart.cudaEventSynchronize(end))
            assert cuda_call(cudart.cudaEventElapsedTime(start, end)) > 0
            assert enqueue_timed_copy(start, end, back.address, on_device.address, 4 * MIB, stream)
            cuda_call(cudart.cudaEventSynchronize(end))
            assert np.array_equal(received, sent)
            pageable = np.ones(4096, np.uint8)
            assert not enqueue_timed_copy(start, end, on_device.address, pageable.ctypes.data, 4096, stream)
            del sent, received
    finally:
        for event in (start, end):
            cudart.cudaEventDestroy(event)
        cudart.cudaStreamDestroy(stream)
        device.close()
        pool.close()
