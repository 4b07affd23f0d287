"""Live swaps under the torch runtime through a real tritonserver: the GPU configuration's engine, here on
the CPU (eager, no CUDA graphs), moving between version 1 (fp16 weights) and version 2 (bf16 weights)."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import MODEL_REPOSITORY, start_server, variant_repository
from tests.e2e.swap_support import LoadStreams, admin

pytestmark = pytest.mark.e2e
KEY = "test-admin-key"
# the GPU configuration's engine parameters (configs/gpu.pbtxt) on a KIND_CPU instance
TORCH_ON_CPU = {"runtime": "torch", "precision": "fp16", "artifact": "model.fp16.safetensors", "device": "cpu",
                "concurrent_batches": "1"}


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory):
    if not (MODEL_REPOSITORY / "text_embedding" / "2" / "model.bf16.safetensors").is_file():
        pytest.skip("text_embedding/2 has no model.bf16.safetensors: run 'fastpath build --if-missing --int8'")
    root = tmp_path_factory.mktemp("torch-swap")
    repository = variant_repository(root, "text_embedding", **TORCH_ON_CPU)
    shutil.copytree(MODEL_REPOSITORY / "fastpath_admin", repository / "fastpath_admin", ignore=shutil.ignore_patterns("__pycache__"))
    server = start_server(root, repository=repository, admin_key=KEY)
    try:
        yield server
    finally:
        server.stop()


def _swap(server, version: int) -> dict:
    return admin(server.http_url, {"command": "swap", "model": "text_embedding", "version": version, "key": KEY})


def _embed(server, text: str) -> tuple[np.ndarray, int]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
        result = client.infer("text_embedding", [tensor])
        return result.as_numpy("EMBEDDING")[0], int(result.as_numpy("MODEL_VERSION")[0, 0])


def test_swap_1_2_1_under_load_on_the_torch_runtime(torch_server, sentences, reference):
    """8 streams (HTTP and gRPC) while the torch-runtime model swaps 1 -> 2 -> 1: every request is answered,
    every response's MODEL_VERSION rows are one version, each stream sees at most the two changes, and both
    versions served; version 2 serves its bf16 weights within its gate (cosine >= 0.999) of sentence-transformers."""
    server = torch_server
    text = "Triton Inference Server serves models over HTTP and gRPC."
    expected = reference([text])[0]
    with LoadStreams(server.http_url, server.grpc_url, sentences[:200], count=8, texts_per_request=2) as load:
        time.sleep(2.0)
        first = _swap(server, 2)
        served_2 = _embed(server, text)
        time.sleep(2.0)
        second = _swap(server, 1)
        served_1 = _embed(server, text)
        time.sleep(2.0)
    records = load.snapshot()
    assert (first["active_version"], second["active_version"]) == (2, 1)
    assert [r[5] for r in records if r[5] is not None] == [] and len(records) > 20
    assert [r[4] for r in records if len(set(r[4])) > 1] == []
    for stream in range(8):
        versions = [r[4][0] for r in sorted(records, key=lambda r: r[1]) if r[0] == stream]
        assert sum(1 for a, b in zip(versions, versions[1:]) if a != b) <= 2, versions
    assert {r[4][0] for r in records} == {1, 2}
    (embedding_2, version_2), (embedding_1, version_1) = served_2, served_1
    assert (version_2, version_1) == (2, 1)
    assert 0.999 <= float(embedding_2 @ expected) < 0.99999  # bf16: within its gate, not fp32-exact
    assert float(embedding_1 @ expected) >= 0.9999
    assert not np.array_equal(embedding_1, embedding_2)
