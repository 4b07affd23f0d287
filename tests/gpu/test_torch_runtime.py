"""The torch runtime on a CUDA GPU: capture/replay with spies, graph vs eager, rows independent of their
batch neighbours, never a stale result (skips without CUDA)."""

from __future__ import annotations

import threading
from unittest import mock

import numpy as np
import pytest

from tests.gpu.torch_support import bundle_dir, require_cuda

pytestmark = pytest.mark.gpu
BATCHES = (1, 2, 4, 8)
LENGTHS = (16, 32, 64, 128, 256)
SENTENCES = [
    "hello world",
    "Triton Inference Server serves models over HTTP and gRPC.",
    "A CUDA graph replays a captured sequence of kernels with fixed addresses.",
    "The quick brown fox jumps over the lazy dog.",
    "",
    "naïve café 的人有",
    "Each request must get its own embedding, never a neighbour's.",
    "Sentence embeddings are unit vectors of 384 dimensions.",
]


@pytest.fixture(scope="module")
def torch():
    return require_cuda()


@pytest.fixture(scope="module")
def tokenizer():
    from fastpath.text import TextTokenizer

    return TextTokenizer(bundle_dir() / "tokenizer.json", max_seq_length=256)


@pytest.fixture(scope="module")
def engine(torch):
    from fastpath.engines.torch import TorchEngine

    with TorchEngine(str(bundle_dir() / "model.fp16.safetensors"), device="cuda", precision="fp16",
                     batch_sizes=BATCHES, lengths=LENGTHS, check_addresses=True) as loaded:
        yield loaded


def feeds(tokenizer, texts, length=None):
    encodings = tokenizer.encode(texts)
    return tokenizer.pad(encodings, length or max(len(e.ids) for e in encodings)).feeds()


def test_captures_every_bucket_largest_first_in_one_pool(torch):
    from fastpath.engines.torch import TorchEngine

    begin = torch.cuda.CUDAGraph.capture_begin
    with mock.patch.object(torch.cuda.CUDAGraph, "capture_begin", autospec=True, side_effect=begin) as spy:
        engine = TorchEngine(str(bundle_dir() / "model.fp16.safetensors"), device="cuda", batch_sizes=(1, 4), lengths=(16, 64))
    try:
        # largest first: by tokens (batch x length), ties by batch
        assert [(b.batch, b.length) for b in engine.buckets] == [(4, 64), (4, 16), (1, 64), (1, 16)]
        pools = {call.args[1] if len(call.args) > 1 else call.kwargs.get("pool") for call in spy.call_args_list}
        assert spy.call_count == 4 and len(pools) == 1 and None not in pools  # one shared pool handle
    finally:
        engine.close()


def test_replay_serves_captured_shapes_and_eager_serves_the_rest(engine, tokenizer, torch):
    replay = torch.cuda.CUDAGraph.replay
    with mock.patch.object(torch.cuda.CUDAGraph, "replay", autospec=True, side_effect=replay) as spy:
        engine.infer(feeds(tokenizer, SENTENCES[:3]))  # 3 rows -> bucket 4
        assert spy.call_count == 1
        engine.infer(feeds(tokenizer, SENTENCES * 2))  # 16 rows > max batch 8: two replays
        assert spy.call_count == 3
    eager_before = engine.runner.eager_runs
    ids = np.array([[101] + [2088] * 298 + [102]], dtype=np.int64)  # 300 tokens: longer than every bucket
    long_batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    with mock.patch.object(torch.cuda.CUDAGraph, "replay", autospec=True, side_effect=replay) as spy:
        out = engine.infer(long_batch)["embedding"]
        assert spy.call_count == 0
    assert engine.runner.eager_runs == eager_before + 1 and out.shape == (1, 384) and np.isfinite(out).all()


def test_graph_matches_eager_within_fp16_tolerance(engine, tokenizer):
    batch = feeds(tokenizer, SENTENCES, 32)  # 8 x 32: exactly a bucket, so eager runs the same shapes
    graph = engine.infer(batch)["embedding"].astype(np.float64)
    eager = engine.infer_eager(batch)["embedding"].astype(np.float64)
    relative = np.linalg.norm(graph - eager, axis=1) / np.linalg.norm(eager, axis=1)
    assert relative.max() <= 1e-3
    assert np.isfinite(graph).all()


def test_fp16_matches_fp32(engine, tokenizer):
    from fastpath.engines.torch import TorchEngine

    batch = feeds(tokenizer, SENTENCES)
    with TorchEngine(str(bundle_dir() / "model.fp16.safetensors"), device="cuda", precision="fp32", batch_sizes=(8,), lengths=(32,)) as fp32:
        reference = fp32.infer(batch)["embedding"]
    cosine = (engine.infer(batch)["embedding"] * reference).sum(1)
    assert cosine.min() >= 0.9999


def test_an_embedding_does_not_depend_on_its_batch_neighbours_or_padding(engine, tokenizer):
    """"hello world" gives the same row alone, beside a 256-token text, and padded to every captured bucket."""
    alone = engine.infer(feeds(tokenizer, ["hello world"]))["embedding"][0]
    long_text = " ".join(["The scheduler pads every batch to a captured bucket."] * 40)  # ~400 tokens, cut at 256
    together = engine.infer(feeds(tokenizer, ["hello world", long_text]))["embedding"][0]
    assert np.abs(together - alone).max() <= 2e-3 and float(together @ alone) >= 0.9999
    for batch in BATCHES:  # padded up to every captured batch size, at every length bucket
        for length in LENGTHS:
            row = engine.infer(feeds(tokenizer, ["hello world"] * batch, length))["embedding"]
            assert np.abs(row - alone).max() <= 2e-3, (batch, length)


def test_a_replay_never_returns_an_earlier_batch_result(engine, tokenizer):
    """Successive batches of the same bucket each get their own texts' rows (equal to eager), never the
    previous batch's output."""
    plain = {text: engine.infer_eager(feeds(tokenizer, [text]))["embedding"][0] for text in SENTENCES}
    previous, last_texts = None, None
    for texts in (SENTENCES[:3], SENTENCES[3:4], SENTENCES[3:4], SENTENCES[1:2], SENTENCES[4:8]):
        out = engine.infer(feeds(tokenizer, texts))["embedding"]
        for text, row in zip(texts, out):
            assert np.isfinite(row).all()
            assert np.abs(row - plain[text]).max() <= 2e-3
        if previous is not None and out.shape == previous.shape and texts != last_texts:
            assert not np.allclose(out, previous, atol=1e-3)
        previous, last_texts = out, texts


def test_concurrent_clients_each_get_their_own_row(engine, tokenizer):
    """Eight threads replaying at once each always get their own text's row."""
    expected = {text: engine.infer_eager(feeds(tokenizer, [text]))["embedding"][0] for text in SENTENCES}
    results: dict[str, list[np.ndarray]] = {text: [] for text in SENTENCES}

    def client(text):
        for _ in range(20):
            results[text].append(engine.infer(feeds(tokenizer, [text]))["embedding"][0])

    threads = [threading.Thread(target=client, args=(text,)) for text in SENTENCES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for text, rows in results.items():
        assert len(rows) == 20 and all(np.abs(row - expected[text]).max() <= 2e-3 for row in rows), text


def test_moved_static_buffer_is_refused_before_replay(torch, tokenizer):
    from fastpath.engines.torch import TorchEngine
    from fastpath.errors import EngineError

    with TorchEngine(str(bundle_dir() / "model.fp16.safetensors"), device="cuda", batch_sizes=(2,), lengths=(16,), check_addresses=True) as engine:
        batch = feeds(tokenizer, ["hello world"], 16)
        engine.infer(batch)
        buffers = engine.runner.buffers
        buffers._device_inputs = buffers._device_inputs.clone()  # what a careless "grow the buffers" would do
        with pytest.raises(EngineError, match="moved from 0x"):
            engine.infer(batch)
