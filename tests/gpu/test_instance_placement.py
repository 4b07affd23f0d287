"""A KIND_GPU instance's torch engine on the GPU Triton assigned it: weights, static buffers, the
runner's stream, graph capture and replay all on that device, nothing on another (skips without
CUDA; the second-GPU tests skip on a machine with one GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.gpu.torch_support import bundle_dir, require_cuda

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    return require_cuda()


def gpu_args(device_id: int) -> dict[str, str]:
    config = {"name": "text_embedding", "parameters": {"runtime": {"string_value": "torch"}}}
    return {"model_config": json.dumps(config), "model_instance_kind": "GPU", "model_instance_device_id": str(device_id),
            "model_instance_name": f"text_embedding_0_{device_id}", "model_name": "text_embedding"}


def embed_on(device_id: int):
    from fastpath.models.text_embedding.config import TextEmbeddingConfig, placed_config
    from fastpath.models.text_embedding.pipeline import TextEmbedder

    config = placed_config(TextEmbeddingConfig(runtime="torch", precision="fp16", artifact="model.fp16.safetensors",
                                               max_batch_texts=4, length_buckets_tokens=(16, 32)), gpu_args(device_id))
    assert config.device == f"cuda:{device_id}"
    return TextEmbedder.from_directory(bundle_dir(), config)


def _weights(torch, model) -> list:
    """Every weight tensor of a torch-runtime ``BertEmbedder`` (a plain object, not an ``nn.Module``): the
    embeddings, their norm and each layer's (weight, bias) pairs, an fp8 weight as its data and scale."""
    values = [model.word, model.position, model.token_type, *model.embedding_norm]
    for layer in model.layers:
        for pair in layer.values():
            values.extend(pair)
    return [t for v in values for t in ((v,) if isinstance(v, torch.Tensor) else (v.data, v.scale))]


def check_engine_on(torch, embedder, device_id: int) -> np.ndarray:
    runner = embedder.engine.runner
    assert runner.device == torch.device("cuda", device_id)
    assert runner._stream.device == torch.device("cuda", device_id)
    assert {w.device for w in _weights(torch, embedder.engine.model)} == {torch.device("cuda", device_id)}
    assert runner.captured, "no CUDA graph was captured"
    result = embedder.embed(["hello world", "Triton places this instance on its GPU."])
    assert sum(runner.replays.values()) >= 1
    return result.embeddings


def test_an_unindexed_cuda_engine_names_its_gpu(torch):
    from fastpath.engines.torch import TorchEngine

    with TorchEngine(str(bundle_dir() / "model.fp16.safetensors"), device="cuda", batch_sizes=(1,), lengths=(16,)) as engine:
        assert engine.device == torch.device("cuda", torch.cuda.current_device())


def test_a_gpu_instance_on_gpu_0_serves_from_it(torch):
    embedder = embed_on(0)
    try:
        embeddings = check_engine_on(torch, embedder, 0)
        assert np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-3)
    finally:
        embedder.close()


def test_a_gpu_instance_on_gpu_1_allocates_nothing_on_gpu_0(torch):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"one CUDA device ({torch.cuda.get_device_name(0)}): placing an instance on GPU 1 needs a second")
    torch.cuda.synchronize(0)
    before = torch.cuda.memory_allocated(0)
    embedder = embed_on(1)
    try:
        on_one = check_engine_on(torch, embedder, 1)
        assert torch.cuda.memory_allocated(0) == before, "the engine of a GPU-1 instance allocated memory on GPU 0"
    finally:
        embedder.close()
    embedder = embed_on(0)
    try:
        np.testing.assert_allclose(check_engine_on(torch, embedder, 0), on_one, atol=2e-3)
    finally:
        embedder.close()


def test_the_staging_pool_of_a_gpu_1_instance_is_pinned_from_gpu_1(torch):
    pytest.importorskip("cuda.bindings", reason="cuda-python (cuda.bindings) is not installed: the pinned pool needs it")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"one CUDA device ({torch.cuda.get_device_name(0)}): a pool allocated from GPU 1 needs a second")
    from fastpath.memory import create_host_pool

    pool = create_host_pool(name="staging", device="cuda:1")
    try:
        assert pool.allocator.name == "cuda-pinned" and pool.allocator.device == 1
        with pool.lease(1 << 20) as lease:
            view = lease.view(np.uint8, 1 << 20)
            view[:] = 7
            copied = torch.from_numpy(view).to("cuda:1", non_blocking=True)
            torch.cuda.synchronize(1)
            assert int(copied.sum(dtype=torch.int64)) == 7 << 20
    finally:
        pool.close()
