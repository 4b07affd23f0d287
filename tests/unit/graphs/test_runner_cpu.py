"""GraphRunner on the CPU (static buffers, eager forward): staging, slicing, splitting, fallback, checks.

Graph capture itself needs CUDA (tests/gpu/test_graphs.py); everything around it runs here on the
same code path. The forward sums each row's masked ids, so every output is an exact integer.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (build extra)")

from fastpath.errors import EngineError  # noqa: E402
from fastpath.graphs import BERT_INPUTS, Bucket, BucketGrid  # noqa: E402
from fastpath.graphs.runner import GraphRunner  # noqa: E402
from tests.unit.graphs.exact_forward import expected, make_batch, masked_sum  # noqa: E402


@pytest.fixture
def runner():
    graph_runner = GraphRunner(masked_sum, BERT_INPUTS, BucketGrid((1, 2, 4), (8, 16)), output_shape=(2,),
                               device="cpu", use_graphs=False, check_addresses=True)
    yield graph_runner
    graph_runner.close()


def test_rows_come_back_exact_and_in_order(runner):
    rng = np.random.default_rng(0)
    for rows, length in ((3, 5), (1, 8), (4, 16), (2, 9)):
        batch = make_batch(rng, rows, length)
        np.testing.assert_array_equal(runner.run(batch), expected(batch))
    assert runner.static_eager_runs == {Bucket(4, 8): 1, Bucket(1, 8): 1, Bucket(4, 16): 1, Bucket(2, 16): 1}


def test_filler_rows_after_a_larger_batch_never_leak(runner):
    rng = np.random.default_rng(1)
    big, small = make_batch(rng, 4, 8), make_batch(rng, 3, 8)  # same bucket; row 3 becomes filler
    runner.run(big)
    out = runner.run(small)
    assert out.shape == (3, 2)
    np.testing.assert_array_equal(out, expected(small))
    host = runner.buffers.host_inputs_numpy(Bucket(4, 8))
    assert host[0, 3, :2].tolist() == [101, 102] and host[1, 3, :3].tolist() == [1, 1, 0]  # row 3 is the empty text now


def test_results_are_fresh_arrays(runner):
    rng = np.random.default_rng(2)
    batch = make_batch(rng, 2, 8)
    first, second = runner.run(batch), runner.run(batch)
    assert not np.shares_memory(first, second)
    first[:] = -1
    np.testing.assert_array_equal(runner.run(batch), expected(batch))


def test_batches_beyond_the_largest_bucket_are_split_and_long_rows_run_eagerly(runner):
    rng = np.random.default_rng(3)
    big = make_batch(rng, 11, 12)
    np.testing.assert_array_equal(runner.run(big), expected(big))
    assert sum(runner.static_eager_runs.values()) == 3  # 4 + 4 + 3
    long = make_batch(rng, 2, 40)
    np.testing.assert_array_equal(runner.run(long), expected(long))
    assert runner.eager_runs == 1


def test_moved_buffers_are_refused(runner):
    rng = np.random.default_rng(4)
    runner.run(make_batch(rng, 1, 8))
    runner.buffers._device_inputs = runner.buffers._device_inputs.clone()
    with pytest.raises(EngineError, match="'input_ids' of bucket batch=1 length=8 moved from 0x"):
        runner.run(make_batch(rng, 1, 8))


def test_empty_batch_and_closed_runner_are_refused(runner):
    empty = {spec.name: np.zeros((0, 4), dtype=np.int64) for spec in BERT_INPUTS}
    with pytest.raises(EngineError, match="empty batch"):
        runner.run(empty)
    runner.close()
    runner.close()  # idempotent
    with pytest.raises(EngineError, match="closed"):
        runner.run(make_batch(np.random.default_rng(5), 1, 8))


def test_graphs_need_cuda():
    with pytest.raises(EngineError, match="CUDA graphs need a CUDA device"):
        GraphRunner(masked_sum, BERT_INPUTS, BucketGrid((1,), (8,)), output_shape=(2,), device="cpu", use_graphs=True)


def test_buckets_shorter_than_the_filler_row_are_refused():
    with pytest.raises(EngineError, match="shorter than the 2-token filler"):
        GraphRunner(masked_sum, BERT_INPUTS, BucketGrid((1,), (1, 8)), output_shape=(2,), device="cpu", use_graphs=False)


def _one_block(batch: dict[str, np.ndarray], order=("input_ids", "attention_mask", "token_type_ids")) -> dict[str, np.ndarray]:
    """The batch's inputs laid out back to back in one int64 [3, b, L] block (as the staging pool lease holds them)."""
    block = np.stack([batch[name] for name in order])
    return {name: block[index] for index, name in enumerate(order)}


def test_a_bucket_shaped_block_goes_to_the_device_without_a_host_copy(runner):
    from fastpath.memory import PoolConfig, create_host_pool

    rng = np.random.default_rng(7)
    batch = make_batch(rng, 4, 16)  # exactly bucket (4, 16)
    pool = create_host_pool(PoolConfig(capacity_bytes=1 << 20, max_block_bytes=1 << 16), allocator="page-aligned")
    with pool.lease(3 * 4 * 16 * 8) as lease:
        views = [lease.view(np.int64, (4, 16), k * 4 * 16 * 8) for k in range(3)]
        for view, name in zip(views, ("input_ids", "attention_mask", "token_type_ids")):
            view[:] = batch[name]
        feeds = dict(zip(("input_ids", "attention_mask", "token_type_ids"), views))
        np.testing.assert_array_equal(runner.run(feeds), expected(batch))
    pool.close()
    assert (runner.direct_transfers, runner.staged_transfers) == (1, 0)
    np.testing.assert_array_equal(runner.run(batch), expected(batch))  # three separate arrays: staged
    assert (runner.direct_transfers, runner.staged_transfers) == (1, 1)


def test_packed_inputs_only_accepts_one_exact_block_in_input_order():
    from fastpath.graphs.staging import packed_inputs

    rng = np.random.default_rng(8)
    batch = make_batch(rng, 2, 8)
    packed = packed_inputs(_one_block(batch), BERT_INPUTS, Bucket(2, 8))
    assert packed.shape == (3, 2, 8)
    np.testing.assert_array_equal(packed[1], batch["attention_mask"])
    assert packed_inputs(_one_block(batch), BERT_INPUTS, Bucket(4, 8)) is None  # rows would need filler
    assert packed_inputs(_one_block(batch, ("attention_mask", "input_ids", "token_type_ids")), BERT_INPUTS, Bucket(2, 8)) is None
    assert packed_inputs(batch, BERT_INPUTS, Bucket(2, 8)) is None  # separate allocations
    strided = {name: np.ascontiguousarray(np.stack([value, value], axis=2))[:, :, 0] for name, value in _one_block(batch).items()}
    assert packed_inputs(strided, BERT_INPUTS, Bucket(2, 8)) is None
    as_int32 = {name: value.astype(np.int32) for name, value in _one_block(batch).items()}
    assert packed_inputs(as_int32, BERT_INPUTS, Bucket(2, 8)) is None


def test_packed_feeds_reach_the_device_as_their_own_block_until_a_slab_is_replaced(runner):
    """Invariant: feeds staged as PackedFeeds (the text_embedding handler's) are handed over as their block itself
    (no strided view, one direct transfer, the same results); once an entry no longer is its slab, the address
    check decides (a separate array: staged through the host buffer)."""
    from fastpath.graphs.staging import PackedFeeds, packed_inputs

    rng = np.random.default_rng(9)
    batch = make_batch(rng, 4, 16)
    block = np.stack([batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")])
    feeds = PackedFeeds(block, ("input_ids", "attention_mask", "token_type_ids"))
    assert packed_inputs(feeds, BERT_INPUTS, Bucket(4, 16)) is block
    assert packed_inputs(feeds, BERT_INPUTS, Bucket(8, 16)) is None  # not the bucket's shape
    np.testing.assert_array_equal(runner.run(feeds), expected(batch))
    assert (runner.direct_transfers, runner.staged_transfers) == (1, 0)
    feeds["attention_mask"] = batch["attention_mask"].copy()
    assert packed_inputs(feeds, BERT_INPUTS, Bucket(4, 16)) is None
    np.testing.assert_array_equal(runner.run(feeds), expected(batch))
    assert (runner.direct_transfers, runner.staged_transfers) == (1, 1)


def test_an_unknown_sync_mode_is_refused_naming_the_choices():
    with pytest.raises(EngineError, match="sync='poll'.*blocking, spin"):
        GraphRunner(masked_sum, BERT_INPUTS, BucketGrid((1,), (8,)), output_shape=(2,), device="cpu", use_graphs=False, sync="poll")


def test_cuda_device_names_the_gpu_and_refuses_what_torch_does_not_see():
    from unittest import mock

    from fastpath.graphs.runner import cuda_device

    assert cuda_device("cpu") == torch.device("cpu")
    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        with pytest.raises(EngineError, match="device 'cuda:1' was asked for but torch .* sees no CUDA device"):
            cuda_device("cuda:1")
    with mock.patch.object(torch.cuda, "is_available", return_value=True), \
            mock.patch.object(torch.cuda, "device_count", return_value=2), \
            mock.patch.object(torch.cuda, "current_device", return_value=1):
        assert cuda_device("cuda") == torch.device("cuda", 1)
        assert cuda_device("cuda:0") == torch.device("cuda", 0)
        with pytest.raises(EngineError, match=r"device 'cuda:2' was asked for but torch sees 2 CUDA device\(s\), 0..1"):
            cuda_device("cuda:2")
