"""The validation gate: its cost (golden inputs per length bucket, verified checksums reused), and which artifact,
precision and tolerance each version gets under each runtime."""

import dataclasses
import json
from unittest import mock

import numpy as np
import pytest
import torch

from fastpath.errors import ArtifactError
from fastpath.manifest import ChecksumCache, read_manifest
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.golden import (
    GOLDEN_TEXTS,
    _version_config,
    embed_by_length,
    golden_min_cosine,
    load_text_version,
    validate_text_version,
)
from tests.conftest import MODEL_REPOSITORY

MODEL_DIR = MODEL_REPOSITORY / "text_embedding"


def test_load_reports_stages_and_second_load_hashes_nothing():
    cache, timings = ChecksumCache(), {}
    embedder = load_text_version(MODEL_DIR, 2, TextEmbeddingConfig(), checksums=cache, timings=timings)
    try:
        assert set(timings) == {"verify_s", "engine_load_s", "warmup_s"} and all(t >= 0 for t in timings.values())
        assert embedder.config.precision == "int8"
        assert validate_text_version(embedder, MODEL_DIR / "2", checksums_verified=True) >= 0.99
    finally:
        embedder.close()
    files = cache.misses
    assert files >= 4
    load_text_version(MODEL_DIR, 2, TextEmbeddingConfig(), checksums=cache).close()
    assert (cache.misses, cache.hits) == (files, files)


def test_golden_texts_run_per_length_bucket_with_the_same_results():
    embedder = load_text_version(MODEL_DIR, 2, TextEmbeddingConfig())
    try:
        texts = list(GOLDEN_TEXTS)
        expected = embedder.embed(texts).embeddings  # one batch, every row padded to the longest (256)
        with mock.patch.object(embedder.engine, "infer", wraps=embedder.engine.infer) as infer:
            got = embed_by_length(embedder, texts)
        shapes = [call.args[0]["input_ids"].shape for call in infer.call_args_list]
        assert (1, 256) in shapes and sum(rows for rows, _ in shapes) == len(texts)
        assert sum(rows * length for rows, length in shapes) < len(texts) * 256 / 4  # padded tokens cut by > 4x
        cosine = (got * expected).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
        assert got.shape == (len(texts), 384) and cosine.min() > 0.99999
    finally:
        embedder.close()


def test_swaps_load_the_external_data_copy_and_share_the_serving_tokenizer():
    serving = load_text_version(MODEL_DIR, 1, TextEmbeddingConfig())
    sha256 = read_manifest(MODEL_DIR / "1")["files"]["tokenizer.json"]
    try:
        standby = load_text_version(MODEL_DIR, 2, TextEmbeddingConfig(), serving_tokenizer=(serving.tokenizer, sha256))
        assert standby.config.artifact == "model.external.onnx" and standby.tokenizer is serving.tokenizer
        standby.close()
        with pytest.raises(ArtifactError, match="differs from the serving version's tokenizer"):
            load_text_version(MODEL_DIR, 2, TextEmbeddingConfig(), serving_tokenizer=(serving.tokenizer, "0" * 64))
    finally:
        serving.close()


TORCH = TextEmbeddingConfig(runtime="torch", precision="fp16", device="cpu", artifact="model.fp16.safetensors", max_batch_texts=4,
                            length_buckets_tokens=(16, 32))


def edited_version(tmp_path, version, edit):
    """``tmp_path/text_embedding/<version>``: the built version's files (links) under a copy of its manifest
    changed by ``edit(manifest)``; returns the model directory."""
    source, target = MODEL_DIR / str(version), tmp_path / "text_embedding" / str(version)
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "manifest.json":
            (target / path.name).symlink_to(path)
    manifest = read_manifest(source)
    edit(manifest)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target.parent


def test_a_torch_runtime_swap_loads_the_file_the_manifest_lists_for_torch_at_the_configs_precision():
    """The GPU configuration's runtime (here on the CPU): version 1's manifest names model.onnx at fp32 for
    ONNX Runtime and model.fp16.safetensors at fp16 for torch; the swap takes the torch file at fp16."""
    embedder = load_text_version(MODEL_DIR, 1, TORCH)
    try:
        assert (embedder.config.artifact, embedder.config.precision) == ("model.fp16.safetensors", "fp16")
        assert embedder.engine.name == "torch" and embedder.engine.precision == "fp16"
    finally:
        embedder.close()


def test_version_2_under_the_torch_runtime_serves_its_bf16_weights_behind_its_own_golden_gate():
    """One torch config (fp16, as gpu.pbtxt): version 2 loads model.bf16.safetensors and runs it in bf16,
    because its manifest's torch entry says bf16; the golden check holds it to golden.min_cosine_by_runtime
    (0.999, not the INT8 0.99 that ONNX Runtime gets), and the real bf16 cosine passes it while staying below
    what fp32 gives (so bf16 really ran)."""
    manifest = read_manifest(MODEL_DIR / "2")
    assert (golden_min_cosine(manifest, "torch"), golden_min_cosine(manifest, "onnxruntime")) == (0.999, 0.99)
    embedder = load_text_version(MODEL_DIR, 2, TORCH)
    try:
        assert (embedder.config.artifact, embedder.config.precision) == ("model.bf16.safetensors", "bf16")
        assert embedder.engine.name == "torch" and embedder.engine.precision == "bf16"
        assert embedder.engine.model.word.dtype == torch.bfloat16
        worst = validate_text_version(embedder, MODEL_DIR / "2", checksums_verified=True)
        assert 0.999 <= worst < 0.99999
        assert worst == pytest.approx(manifest["accuracy"]["torch"]["golden"]["min_cosine"], abs=2e-5)
    finally:
        embedder.close()


def test_the_torch_gate_refuses_version_2_when_bf16_misses_it(tmp_path):
    """A torch gate above what bf16 reaches (0.99999): the golden check fails naming the cosine, the
    tolerance and the artifact, although the same outputs clear the INT8 gate (0.99)."""
    def stricter(manifest):
        manifest["golden"]["min_cosine_by_runtime"]["torch"] = 0.99999

    model_dir = edited_version(tmp_path, 2, stricter)
    embedder = load_text_version(model_dir, 2, TORCH)
    try:
        with pytest.raises(ArtifactError, match=r"golden check failed: cosine 0\.999\d+ on .* is below the version's tolerance "
                                                r"0\.99999 for model\.bf16\.safetensors \(torch, bf16\)"):
            validate_text_version(embedder, model_dir / "2")
    finally:
        embedder.close()


def test_version_1_keeps_fp16_whatever_precision_the_config_names():
    """The manifest's torch entry decides: a config asking bf16 still loads version 1 at the fp16 it lists."""
    embedder = load_text_version(MODEL_DIR, 1, dataclasses.replace(TORCH, precision="bf16"))
    try:
        assert (embedder.config.precision, embedder.engine.precision) == ("fp16", "fp16")
    finally:
        embedder.close()


def test_a_torch_entry_without_a_precision_keeps_the_configs(tmp_path):
    """Version 1 with its torch entry listing only the file: the engine runs at the config's precision (fp32)."""
    def no_precision(manifest):
        del manifest["artifacts"]["torch"]["precision"]

    model_dir = edited_version(tmp_path, 1, no_precision)
    embedder = load_text_version(model_dir, 1, dataclasses.replace(TORCH, precision="fp32"))
    try:
        assert (embedder.config.artifact, embedder.config.precision) == ("model.fp16.safetensors", "fp32")
        assert embedder.engine.precision == "fp32" and embedder.engine.model.word.dtype == torch.float32
        assert validate_text_version(embedder, model_dir / "1") >= 0.9999
    finally:
        embedder.close()


def test_a_torch_entry_with_a_precision_the_engine_does_not_take_is_refused(tmp_path):
    def unknown(manifest):
        manifest["artifacts"]["torch"]["precision"] = "fp4"

    with pytest.raises(ArtifactError, match=r"1/manifest.json lists model.fp16.safetensors for runtime 'torch' at precision "
                                            r"'fp4', which the engine does not take \(config.pbtxt parameter 'precision'"):
        load_text_version(edited_version(tmp_path, 1, unknown), 1, TORCH)


def test_the_tensorrt_entries_describe_a_plan_build_and_keep_the_configs_precision():
    """Version 2's tensorrt entry says 'int8 (explicit quantization) + fp16' in words: not an engine precision."""
    base = dataclasses.replace(TORCH, runtime="tensorrt", artifact="model.onnx", precision="int8")
    config = _version_config(read_manifest(MODEL_DIR / "2"), base, MODEL_DIR / "2")
    assert (config.artifact, config.precision) == ("model.onnx", "int8")


def test_a_version_without_an_artifact_for_the_serving_runtime_is_refused_naming_what_it_has(tmp_path):
    """Version 2 as built before it had bf16 weights: no torch entry, so the GPU configuration cannot swap to it."""
    def without_torch(manifest):
        del manifest["artifacts"]["torch"]

    with pytest.raises(ArtifactError, match=r"2/manifest.json lists no artifact for runtime 'torch' \(it lists onnxruntime, tensorrt\); "
                                            r"the serving configuration runs 'torch': expected a version built for it"):
        load_text_version(edited_version(tmp_path, 2, without_torch), 2, TORCH)


def test_a_version_verifies_the_files_its_runtime_loads_and_may_lack_the_others(tmp_path):
    """Invariant: a version is verified by the files the serving runtime loads (artifact, tokenizer,
    golden.npz). A GPU host with only version 2's torch files (no INT8 model.onnx, no external-data copy)
    loads and golden-checks it; the same directory under ONNX Runtime is refused naming the missing file,
    and a bf16 file that does not match its manifest is refused under torch."""
    source, target = MODEL_DIR / "2", tmp_path / "gpu_host" / "text_embedding" / "2"
    target.mkdir(parents=True)
    for name in ("manifest.json", "tokenizer.json", "golden.npz", "model.bf16.safetensors"):
        (target / name).symlink_to(source / name)
    embedder = load_text_version(target.parent, 2, TORCH)
    try:
        assert validate_text_version(embedder, target) >= 0.999
    finally:
        embedder.close()
    with pytest.raises(ArtifactError, match=r"2/model.(external.)?onnx is listed in manifest.json but missing"):
        load_text_version(target.parent, 2, TextEmbeddingConfig())
    (target / "model.bf16.safetensors").unlink()
    (target / "model.bf16.safetensors").write_bytes(b"not the weights")
    with pytest.raises(ArtifactError, match=r"model.bf16.safetensors"):
        load_text_version(target.parent, 2, TORCH)
