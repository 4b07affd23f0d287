"""The shared CUDA-graph mechanism with a small exact forward (tests/unit/graphs/exact_forward.py; skips without CUDA)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from tests.gpu.torch_support import require_cuda
from tests.unit.graphs.exact_forward import expected, make_batch, masked_sum

pytestmark = pytest.mark.gpu
pytest.importorskip("torch", reason="torch is not installed: the CUDA-graph tests need it")


@pytest.fixture(scope="module")
def torch():
    return require_cuda()


@pytest.fixture
def runner(torch):
    from fastpath.graphs import BERT_INPUTS, BucketGrid
    from fastpath.graphs.runner import GraphRunner

    graph_runner = GraphRunner(masked_sum, BERT_INPUTS, BucketGrid((1, 2, 4, 8), (16, 32)), output_shape=(2,),
                               device="cuda", check_addresses=True)
    graph_runner.capture()
    yield graph_runner
    graph_runner.close()


def test_captured_largest_first(runner):
    assert [(b.batch, b.length) for b in runner.captured][:3] == [(8, 32), (8, 16), (4, 32)]  # tokens, then batch
    assert len(runner.captured) == 8


def test_padding_rows_never_returned_and_rows_exact(runner, torch):
    rng = np.random.default_rng(0)
    replay = torch.cuda.CUDAGraph.replay
    with mock.patch.object(torch.cuda.CUDAGraph, "replay", autospec=True, side_effect=replay) as spy:
        for rows, length in ((3, 10), (1, 16), (5, 17), (8, 32), (2, 2)):
            batch = make_batch(rng, rows, length)
            out = runner.run(batch)
            assert out.shape == (rows, 2)
            np.testing.assert_array_equal(out, expected(batch))
        assert spy.call_count == 5


def test_batch_larger_than_max_is_split_and_longer_than_max_runs_eagerly(runner):
    rng = np.random.default_rng(1)
    big = make_batch(rng, 19, 20)
    np.testing.assert_array_equal(runner.run(big), expected(big))
    assert sum(runner.replays.values()) == 3  # 8 + 8 + 3 rows
    long = make_batch(rng, 3, 40)
    np.testing.assert_array_equal(runner.run(long), expected(long))
    assert runner.eager_runs == 1


def test_a_replay_never_returns_a_previous_batch_result(runner):
    """A smaller batch after a larger one in the same bucket gets only its own rows (the stale rows are
    overwritten), and each run returns a fresh array, never a view of the pinned buffer."""
    rng = np.random.default_rng(2)
    first, second = make_batch(rng, 3, 16), make_batch(rng, 1, 16)
    out_first, out_second = runner.run(first), runner.run(second)
    np.testing.assert_array_equal(out_first, expected(first))
    np.testing.assert_array_equal(out_second, expected(second))  # row 0 of the padded batch of 4 was overwritten
    again = runner.run(first)
    np.testing.assert_array_equal(again, out_first)
    assert again is not out_first and not np.shares_memory(again, out_first)  # fresh arrays, never the pinned buffer


def test_address_check_refuses_moved_buffers(runner):
    from fastpath.errors import EngineError

    rng = np.random.default_rng(3)
    runner.run(make_batch(rng, 2, 16))
    runner.buffers._device_output = runner.buffers._device_output.clone()
    with pytest.raises(EngineError, match="'output' of bucket batch=2 length=16 moved"):
        runner.run(make_batch(rng, 2, 16))


def test_a_pinned_pool_block_of_a_bucket_shape_is_replayed_with_one_dma_and_no_host_copy(runner):
    """The scheduler's staging-pool lease (cudaHostAlloc) goes straight to the graph's device inputs."""
    from fastpath.graphs import Bucket
    from fastpath.memory import PoolConfig, create_host_pool

    rng = np.random.default_rng(5)
    pool = create_host_pool(PoolConfig(capacity_bytes=1 << 20, max_block_bytes=1 << 16), allocator="cuda-pinned")
    names = ("input_ids", "attention_mask", "token_type_ids")
    for rows, length in ((4, 16), (8, 32), (4, 16)):
        batch = make_batch(rng, rows, length)
        with pool.lease(3 * rows * length * 8) as lease:
            views = [lease.view(np.int64, (rows, length), k * rows * length * 8) for k in range(3)]
            for view, name in zip(views, names):
                view[:] = batch[name]
            np.testing.assert_array_equal(runner.run(dict(zip(names, views))), expected(batch))
    pool.close()
    assert (runner.direct_transfers, runner.staged_transfers) == (3, 0)
    assert runner.replays[Bucket(4, 16)] == 2 and runner.replays[Bucket(8, 32)] == 1


@pytest.mark.parametrize("sync", ["blocking", "spin"])
def test_both_sync_modes_return_the_same_exact_rows(torch, sync):
    from fastpath.graphs import BERT_INPUTS, BucketGrid
    from fastpath.graphs.runner import GraphRunner

    graph_runner = GraphRunner(masked_sum, BERT_INPUTS, BucketGrid((1, 4), (16,)), output_shape=(2,), device="cuda", sync=sync)
    graph_runner.capture()
    rng = np.random.default_rng(9)
    for rows in (1, 3, 4):
        batch = make_batch(rng, rows, 16)
        np.testing.assert_array_equal(graph_runner.run(batch), expected(batch))
    graph_runner.close()


def test_a_capture_beside_a_serving_runner_leaves_both_exact(runner, torch):
    """A live swap captures the new version's graphs in the process that serves the old one. Invariant: while
    another thread replays and synchronizes without pause, every capture succeeds and every served row is exact
    (a capture in CUDA's global mode fails both: the server's synchronizes are prohibited during it)."""
    import threading

    from fastpath.graphs import BERT_INPUTS, BucketGrid
    from fastpath.graphs.runner import GraphRunner

    stop, served, errors = threading.Event(), [0], []

    def serve() -> None:
        rng = np.random.default_rng(11)
        while not stop.is_set():
            batch = make_batch(rng, int(rng.integers(1, 9)), int(rng.integers(1, 33)))
            try:
                np.testing.assert_array_equal(runner.run(batch), expected(batch))
            except Exception as exc:  # noqa: BLE001  (reported below, with the served count)
                errors.append(repr(exc))
                return
            served[0] += 1

    server = threading.Thread(target=serve)
    server.start()
    try:
        for attempt in range(5):
            fresh = GraphRunner(masked_sum, BERT_INPUTS, BucketGrid((1, 2, 4, 8, 16), (16, 32, 64)), output_shape=(2,),
                                device="cuda")
            fresh.capture()
            batch = make_batch(np.random.default_rng(attempt), 16, 64)
            np.testing.assert_array_equal(fresh.run(batch), expected(batch))
            assert len(fresh.captured) == 15
            fresh.close()
    finally:
        stop.set()
        server.join()
    assert errors == [], f"serving thread failed after {served[0]} exact runs: {errors}"
    assert served[0] > 0


def test_runners_built_after_others_closed_reuse_their_streams_so_cublas_workspaces_stay_bounded(torch):
    """torch keeps a cuBLAS workspace (32 MiB on sm90) per (cuBLAS handle, stream) for the life of the process.
    A runner warms up and captures on its capture stream, so a runner on new streams adds a workspace that
    outlives it (each live version swap did). Invariant: a runner built after another closed takes that one's
    streams, so device memory after each build/capture/close cycle stays where the first cycle left it (within
    1 MiB), and every runner's graphs return the exact result."""
    from fastpath.graphs import BERT_INPUTS, BucketGrid
    from fastpath.graphs.runner import GraphRunner

    eye = torch.eye(2, device="cuda")

    def through_cublas(ids, mask, types):  # a float32 GEMM (cuBLAS) by the identity: still exact integers
        return masked_sum(ids, mask, types) @ eye

    batch = make_batch(np.random.default_rng(3), 3, 16)
    allocated = []
    for _ in range(6):
        graph_runner = GraphRunner(through_cublas, BERT_INPUTS, BucketGrid((1, 4), (16,)), output_shape=(2,), device="cuda")
        graph_runner.capture()
        np.testing.assert_array_equal(graph_runner.run(batch), expected(batch))
        graph_runner.close()
        allocated.append(torch.cuda.memory_allocated())
    assert max(allocated) - allocated[0] <= 1 << 20, f"torch's allocated bytes after each cycle: {allocated}"
