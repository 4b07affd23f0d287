"""Version 2 under the GPU configuration: its bf16 weights on CUDA with one graph per bucket, held to its own
golden gate, and a live swap 1 (fp16) -> 2 (bf16) on the GPU engine path (skips without CUDA)."""

from __future__ import annotations

import json

import pytest

from tests.gpu.torch_support import require_cuda, torch_versions

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    return require_cuda()


def gpu_config():
    """The parameters of the shipped ``configs/gpu.pbtxt``, placed as Triton places a KIND_GPU instance on GPU 0."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    from fastpath.cli.common import DEFAULT_REPOSITORY
    from fastpath.config import parse_sections, triton_parameters
    from fastpath.models.text_embedding.config import EmbeddingSchedulerConfig, TextEmbeddingConfig, placed_config

    parsed = text_format.Parse((DEFAULT_REPOSITORY / "text_embedding" / "configs" / "gpu.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    model_config = json.dumps(json_format.MessageToDict(parsed, preserving_proto_field_name=True))
    config, _ = parse_sections(triton_parameters(model_config), TextEmbeddingConfig, EmbeddingSchedulerConfig)
    args = {"model_config": model_config, "model_instance_kind": "GPU", "model_instance_device_id": "0",
            "model_instance_name": "text_embedding_0_0", "model_name": "text_embedding"}
    return placed_config(config, args)


def test_version_2_runs_its_bf16_weights_with_cuda_graphs_within_its_golden_gate(torch, tmp_path):
    """gpu.pbtxt says fp16; version 2's manifest gives model.bf16.safetensors at bf16: loaded so on cuda:0, every
    bucket captured, and the golden texts within golden.min_cosine_by_runtime.torch of fp32, below 1 (bf16 ran)."""
    from fastpath.manifest import read_manifest
    from fastpath.models.text_embedding.golden import golden_min_cosine, load_text_version, validate_text_version

    model_dir = torch_versions(tmp_path)
    config = gpu_config()
    assert (config.runtime, config.precision, config.device) == ("torch", "fp16", "cuda:0")
    embedder = load_text_version(model_dir, 2, config)
    try:
        engine = embedder.engine
        assert (embedder.config.artifact, engine.precision) == ("model.bf16.safetensors", "bf16")
        assert engine.model.word.dtype == torch.bfloat16 and engine.model.word.device == torch.device("cuda", 0)
        assert len(engine.buckets) == 7 * 5  # gpu.pbtxt's batch x length buckets, one CUDA graph each
        replays = sum(engine.runner.replays.values())
        worst = validate_text_version(embedder, model_dir / "2", checksums_verified=True)
        assert sum(engine.runner.replays.values()) > replays  # the golden texts ran on the captured graphs
        gate = golden_min_cosine(read_manifest(model_dir / "2"), "torch")
        print(f"version 2 bf16 on {torch.cuda.get_device_name(0)}: golden min cosine {worst:.6f} (gate {gate})")
        assert gate <= worst < 0.99999
    finally:
        embedder.close()


def test_a_live_swap_moves_the_gpu_configuration_from_version_1_fp16_to_version_2_bf16(torch, tmp_path, monkeypatch):
    """The serving instance's own path (VersionedEmbedder: load beside the serving engine, golden check, flip):
    version 1 serves at fp16, version 2 after the swap at bf16, both on cuda:0 with graphs; then back to 1."""
    from fastpath.models.text_embedding.versions import VersionedEmbedder

    monkeypatch.setenv("FASTPATH_STATE_DIR", str(tmp_path / "state"))
    model_dir = torch_versions(tmp_path)
    versions = VersionedEmbedder(model_dir, 1, gpu_config(), instance="text_embedding_0_0", model_name="text_embedding")
    try:
        with versions.lease() as (embedder, version):
            assert (version, embedder.engine.precision) == (1, "fp16") and embedder.engine.buckets
            before = embedder.embed(["hello world"]).embeddings[0]
        versions.slots.swap(2, versions._load, versions._validate)
        with versions.lease() as (embedder, version):
            assert (version, embedder.engine.precision, embedder.config.artifact) == (2, "bf16", "model.bf16.safetensors")
            assert embedder.engine.device == torch.device("cuda", 0) and embedder.engine.buckets
            after = embedder.embed(["hello world"]).embeddings[0]
        assert set(versions.stages_s) == {"verify_s", "engine_load_s", "warmup_s", "golden_s"}
        assert 0.999 <= float(before @ after) < 1.0
        versions.slots.swap(1, versions._load, versions._validate)
        with versions.lease() as (embedder, version):
            assert (version, embedder.engine.precision) == (1, "fp16")
    finally:
        versions.close()


def test_live_swaps_leave_the_gpu_memory_where_the_same_serving_version_left_it(torch, tmp_path, monkeypatch):
    """Each swap builds and captures the new version beside the serving one, then closes the old. Invariant:
    nothing of a closed version stays on the device (its graphs, buffers, weights, and torch's cuBLAS workspaces
    of the streams it captured on, which the next version reuses), so torch's allocated bytes after a swap to a
    version equal those after the previous swap to that version, within 1 MiB, over three round trips."""
    from fastpath.models.text_embedding.versions import VersionedEmbedder

    monkeypatch.setenv("FASTPATH_STATE_DIR", str(tmp_path / "state"))
    model_dir = torch_versions(tmp_path)
    versions = VersionedEmbedder(model_dir, 1, gpu_config(), instance="text_embedding_0_0", model_name="text_embedding")
    allocated = []
    try:
        for target in (2, 1, 2, 1, 2, 1):
            versions.slots.swap(target, versions._load, versions._validate)
            with versions.lease() as (embedder, version):
                assert version == target
                embedder.embed(["hello world"])
            torch.cuda.synchronize()
            allocated.append(torch.cuda.memory_allocated())
    finally:
        versions.close()
    growth = [after - before for before, after in zip(allocated, allocated[2:])]
    print(f"torch's allocated MiB after each swap: {[round(a / 2**20, 1) for a in allocated]}")
    assert max(growth) <= 1 << 20, f"allocated bytes after swaps to 2, 1, 2, 1, 2, 1: {allocated}"
