"""The validation gate's cost: golden inputs run per length bucket, loading reuses verified checksums."""

from unittest import mock

import numpy as np
import pytest

from fastpath.errors import ArtifactError
from fastpath.manifest import ChecksumCache, read_manifest
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.golden import GOLDEN_TEXTS, embed_by_length, load_text_version, validate_text_version
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


def test_a_torch_runtime_swap_loads_the_file_the_manifest_lists_for_torch_at_the_configs_precision():
    """The GPU configuration's runtime (here on the CPU): version 1's manifest names model.onnx at fp32 for
    ONNX Runtime and model.fp16.safetensors for torch; the swap takes the torch file and keeps fp16."""
    embedder = load_text_version(MODEL_DIR, 1, TORCH)
    try:
        assert (embedder.config.artifact, embedder.config.precision) == ("model.fp16.safetensors", "fp16")
        assert embedder.engine.name == "torch"
    finally:
        embedder.close()


def test_a_version_without_an_artifact_for_the_serving_runtime_is_refused_naming_what_it_has():
    with pytest.raises(ArtifactError, match=r"2/manifest.json lists no artifact for runtime 'torch' \(it lists onnxruntime, tensorrt\); "
                                            r"the serving configuration runs 'torch': expected a version built for it"):
        load_text_version(MODEL_DIR, 2, TORCH)
