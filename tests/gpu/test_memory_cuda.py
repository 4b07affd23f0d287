"""The CUDA allocators and the batch transfer path on a real device (skipped without CUDA, saying why)."""

from __future__ import annotations

import numpy as np
import pytest

from fastpath.errors import UnavailableError
from fastpath.memory import BlockPool, CudaDeviceAllocator, CudaError, PoolConfig, create_host_pool, cuda_call, probe_cuda
from fastpath.memory.transfer import CudaTransferPath, create_transfer_path

PROBE = probe_cuda()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not PROBE.available, reason=f"no CUDA device: {PROBE.reason}")]
MIB = 1 << 20


@pytest.fixture
def cudart():
    from cuda.bindings import runtime

    return runtime


@pytest.fixture
def path():
    transfer = create_transfer_path(
        PoolConfig(capacity_bytes=256 * MIB, max_block_bytes=64 * MIB, wait_timeout_s=0.5),
        PoolConfig(capacity_bytes=256 * MIB, max_block_bytes=64 * MIB, wait_timeout_s=0.5),
    )
    yield transfer
    reports = transfer.close()
    assert reports is not None and all(report.ok for report in reports), [str(r) for r in reports]


def _device_copy(cudart, batch, src, name="out"):
    """A device-to-device copy on the batch's stream, standing in for an engine writing an output."""
    out = batch.empty(name, src.shape, src.dtype)
    if out.nbytes:
        kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        cuda_call(cudart.cudaMemcpyAsync(out.address, src.address, out.nbytes, kind, batch.stream), "d2d")
    return out


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


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_])
def test_round_trip_through_device_is_exact(cudart, path, dtype):
    rng = np.random.default_rng()
    for rows in ((1,), (3, 5, 2), (7, 1)):  # fresh data each batch: stale pooled blocks cannot pass
        parts = [(rng.standard_normal((n, 3, 17)) * 100).astype(dtype) for n in rows]
        with path.batch() as batch:
            uploaded = batch.upload("x", parts)
            assert uploaded.shape == (sum(rows), 3, 17) and uploaded.dtype == np.dtype(dtype)
            host = batch.download(_device_copy(cudart, batch, uploaded))
            batch.synchronize()
            np.testing.assert_array_equal(host, np.concatenate(parts))
    assert path.host_pool.stats().outstanding == 0 and path.device_pool.stats().outstanding == 0


def test_large_batches_are_staged_by_the_copy_threads_exactly(cudart, path):
    rng = np.random.default_rng()
    parts = [rng.standard_normal((n, 3, 512, 512), dtype=np.float32) for n in (1, 3, 1)]  # 15.7 MB > 4 MiB
    before = path.copier.tasks_submitted
    with path.batch() as batch:
        host = batch.download(_device_copy(cudart, batch, batch.upload("pixel_values", parts)))
        batch.synchronize()
        np.testing.assert_array_equal(host, np.concatenate(parts))
    assert path.copier.workers == 4 and path.copier.tasks_submitted > before


def test_one_h2d_copy_per_input_and_none_for_zero_bytes(cudart, path):
    ids = [np.arange(12, dtype=np.int64).reshape(1, 12), np.arange(24, dtype=np.int64).reshape(2, 12)]
    empty = [np.empty((0, 4), np.float32), np.empty((0, 4), np.float32)]
    before = path.stats()
    with path.batch() as batch:
        dev_ids = batch.upload("input_ids", ids)
        dev_empty = batch.upload("boxes", empty)
        assert dev_empty.address == 0 and dev_empty.shape == (0, 4)
        boxes = batch.download(_device_copy(cudart, batch, dev_empty, "boxes_out"))
        got = batch.download(_device_copy(cudart, batch, dev_ids, "ids_out"))
        batch.synchronize()
        assert boxes.shape == (0, 4) and boxes.dtype == np.float32
        np.testing.assert_array_equal(got, np.concatenate(ids))
    after = path.stats()
    assert after["h2d_copies"] - before["h2d_copies"] == 1
    assert after["d2h_copies"] - before["d2h_copies"] == 1
    assert after["zero_byte_skips"] - before["zero_byte_skips"] == 3  # upload, empty() output, download


def test_steady_state_allocates_nothing(cudart, path):
    rng = np.random.default_rng(1)

    def run_batch(rows):
        parts = [rng.integers(0, 30000, (n, 128), dtype=np.int64) for n in rows]
        with path.batch() as batch:
            out = batch.download(_device_copy(cudart, batch, batch.upload("input_ids", parts)))
            batch.synchronize()
            np.testing.assert_array_equal(out, np.concatenate(parts))

    for rows in ((1, 2, 1), (3, 4, 1)):  # warm-up: the 4 KiB and 8 KiB classes the loop below uses
        run_batch(rows)
    host, device, events = path.host_pool.allocator.allocations, path.device_pool.allocator.allocations, path.stats()["events_created"]
    for index in range(40):
        run_batch((1 + index % 5, 2, 1))  # 4..8 rows x 1 KiB
    assert path.host_pool.allocator.allocations == host
    assert path.device_pool.allocator.allocations == device
    assert path.stats()["events_created"] == events


def test_query_reports_completion_and_close_releases_everything(path):
    with path.batch() as batch:
        batch.upload("x", [np.ones((256, 1024), np.float32)])
        batch.synchronize()
        assert batch.query() is True
        assert path.host_pool.stats().outstanding == 1 and path.device_pool.stats().outstanding == 1
    assert path.host_pool.stats().outstanding == 0 and path.device_pool.stats().outstanding == 0


def test_device_pool_exhaustion_is_retryable_not_a_crash():
    host = create_host_pool(PoolConfig(capacity_bytes=8 * MIB, max_block_bytes=8 * MIB))
    device = BlockPool(CudaDeviceAllocator(0), PoolConfig(capacity_bytes=4 * MIB, max_block_bytes=4 * MIB, wait_timeout_s=0.0), name="device")
    path = CudaTransferPath(host, device, owns_pools=True)
    try:
        with path.batch() as batch:
            batch.upload("a", [np.ones((1, MIB), np.float32)])  # 4 MiB: fills the device pool
            with pytest.raises(UnavailableError, match="device pool .* exhausted"):
                batch.upload("b", [np.ones((1, 16), np.float32)])
    finally:
        reports = path.close()
    assert all(report.ok for report in reports)


def test_torch_runs_on_the_path_stream_over_pool_buffers(path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng()
    parts = [rng.standard_normal((n, 384)).astype(np.float32) for n in (2, 5)]
    with path.batch() as batch:
        x = batch.upload("x", parts)
        y = batch.empty("y", x.shape, x.dtype)
        with torch.cuda.stream(torch.cuda.ExternalStream(int(batch.stream))):
            torch.as_tensor(y, device="cuda").copy_(torch.as_tensor(x, device="cuda") * 2.0 + 1.0)
        host = batch.download(y)
        batch.synchronize()
        np.testing.assert_allclose(host, np.concatenate(parts) * 2.0 + 1.0, rtol=1e-6)


def test_cuda_call_raises_on_a_real_failure(cudart):
    with pytest.raises(CudaError, match="cudaErrorInvalidDevice") as info:
        cuda_call(cudart.cudaSetDevice(10_000), "cudaSetDevice(10000)")
    assert info.value.call == "cudaSetDevice(10000)"
