"""Live version swaps through a real tritonserver: under load, refusals, key, memory."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.e2e.swap_support import MODELS, LoadStreams, admin, link_version, make_swap_repository

pytestmark = pytest.mark.e2e
KEY = "test-admin-key"
V1 = MODELS / "text_embedding" / "1"
V2 = MODELS / "text_embedding" / "2"


@pytest.fixture(scope="module")
def swap_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("swap")
    repository = make_swap_repository(root, {1: V1, 2: V2 if (V2 / "manifest.json").exists() else V1})
    server = start_server(root, repository=repository, admin_key=KEY)
    try:
        yield server, repository / "text_embedding"
    finally:
        server.stop()


def _swap(server, version, protocol="http", key=KEY):
    return admin(server.http_url if protocol == "http" else server.grpc_url,
                 {"command": "swap", "model": "text_embedding", "version": version, "key": key}, protocol)


def _status(server):
    return admin(server.http_url, {"command": "status", "model": "text_embedding"})


def _stub_rss_kib(repository: Path) -> int:
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, PermissionError, NotADirectoryError):
            continue
        if b"triton_python_backend_stub" in cmdline and str(repository).encode() in cmdline:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    raise AssertionError(f"no python-backend stub of {repository} found")


def test_swap_v1_v2_v1_under_load_fails_no_request(swap_server, sentences):
    """16 streams (HTTP and gRPC): zero failures, one version per response, one change per swap."""
    server, _ = swap_server
    with LoadStreams(server.http_url, server.grpc_url, sentences[:400], count=16) as load:
        time.sleep(2.0)
        first = _swap(server, 2)
        time.sleep(2.0)
        second = _swap(server, 1, protocol="grpc")
        time.sleep(2.0)
    records = load.snapshot()
    assert first["active_version"] == 2 and second["active_version"] == 1
    errors = [r[5] for r in records if r[5] is not None]
    assert errors == [] and len(records) > 50
    for stream in range(16):
        versions = [r[4][0] for r in sorted(records, key=lambda r: r[1]) if r[0] == stream]
        changes = sum(1 for a, b in zip(versions, versions[1:]) if a != b)
        assert changes <= 2, versions
    assert {r[4][0] for r in records} == {1, 2}


def test_each_response_comes_from_one_version_across_swaps(swap_server, sentences):
    """Requests of 6 texts of mixed lengths run in several batches, and a flip can fall between them; rows
    of another version run again on the active one, so every response's MODEL_VERSION rows are equal."""
    server, _ = swap_server
    mixed = [text for pair in zip(sentences[:200], sentences[200:400][::-1]) for text in pair]
    long_text = " ".join(["version"] * 150)
    texts = [long_text if k % 6 == 5 else text for k, text in enumerate(mixed)]
    with LoadStreams(server.http_url, server.grpc_url, texts, count=8, texts_per_request=6) as load:
        swaps = []
        for version in (2, 1, 2, 1):
            time.sleep(1.0)
            swaps.append(_swap(server, version)["active_version"])
        time.sleep(1.0)
    records = load.snapshot()
    assert swaps == [2, 1, 2, 1]
    assert [r[5] for r in records if r[5] is not None] == [] and len(records) > 30
    assert [r[4] for r in records if len(set(r[4])) > 1] == []
    assert {r[4][0] for r in records} == {1, 2}


def test_swap_without_key_is_refused(swap_server):
    server, _ = swap_server
    for key in ("", "wrong"):
        with pytest.raises(InferenceServerException, match="admin key missing or wrong"):
            _swap(server, 2, key=key)
    assert _status(server)["active_version"] == 1


def test_triton_repository_api_needs_the_key(swap_server):
    """Triton's own load/unload is restricted to clients that send the admin key header."""
    import tritonclient.http as httpclient

    server, _ = swap_server
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="fastpath-admin-key"):
        client.unload_model("text_embedding")
    assert client.is_model_ready("text_embedding")
    index = client.get_model_repository_index(headers={"fastpath-admin-key": KEY})
    assert {m["name"] for m in index} >= {"text_embedding", "fastpath_admin"}
    # log and trace settings too: otherwise any client could turn on verbose logging
    with pytest.raises(InferenceServerException, match="fastpath-admin-key"):
        client.update_log_settings({"log_verbose_level": 1})
    with pytest.raises(InferenceServerException, match="fastpath-admin-key"):
        client.update_trace_settings(settings={"trace_rate": "1"})
    assert client.get_log_settings(headers={"fastpath-admin-key": KEY})["log_verbose_level"] == 0


def _corrupt_versions(model_dir: Path) -> dict[int, str]:
    """Versions 3-6, each broken in one way; returns version -> expected reason."""
    import onnx

    link_version(model_dir / "1", model_dir / "3")
    bad = model_dir / "3" / "tokenizer.json"
    target = bad.resolve()
    bad.unlink()
    bad.write_text(target.read_text().replace('"[UNK]"', '"[UNX]"', 1))  # same size, one byte off the manifest
    link_version(model_dir / "1", model_dir / "4")
    (model_dir / "4" / "model.onnx").unlink()
    link_version(model_dir / "1", model_dir / "5")
    with np.load(model_dir / "5" / "golden.npz") as golden:
        texts, embeddings = golden["texts"], golden["embeddings"]
    from fastpath.manifest import read_manifest, write_manifest
    from fastpath.models.text_embedding.golden import write_golden

    (model_dir / "5" / "golden.npz").unlink()
    write_golden(model_dir / "5", tuple(texts), embeddings[::-1].copy())  # golden rows no longer match
    manifest = read_manifest(model_dir / "5")
    write_manifest(model_dir / "5", manifest.pop("files"), manifest)
    link_version(model_dir / "1", model_dir / "6")
    fixed = onnx.load(str(model_dir / "1" / "model.onnx"))
    for graph_input in fixed.graph.input:
        for dim, value in zip(graph_input.type.tensor_type.shape.dim, (1, 128)):
            dim.dim_value = value  # an ONNX exported with fixed batch 1 and length 128
    (model_dir / "6" / "model.onnx").unlink()
    onnx.save(fixed, str(model_dir / "6" / "model.onnx"))
    manifest = read_manifest(model_dir / "6")
    write_manifest(model_dir / "6", manifest.pop("files"), manifest)
    return {3: "tokenizer.json fails its checksum", 4: "model.onnx is listed in manifest.json but missing",
            5: "golden check failed", 6: "input input_ids is int64[1, 128], config needs int64[-1, -1]"}


def test_corrupt_versions_are_refused_while_serving_continues(swap_server):
    server, model_dir = swap_server
    _swap(server, 2)
    try:
        for version, reason in _corrupt_versions(model_dir).items():
            with pytest.raises(InferenceServerException, match=re.escape(reason)):
                _swap(server, version)
            status = _status(server)
            assert status["active_version"] == 2
            (instance,) = status["instances"].values()
            assert reason in instance["error"]
    finally:
        _swap(server, 1)
        for version in (3, 4, 5, 6):
            shutil.rmtree(model_dir / str(version), ignore_errors=True)


def test_twenty_swaps_return_memory_to_baseline(swap_server):
    server, model_dir = swap_server
    _swap(server, 2)
    _swap(server, 1)  # baseline after one round trip: both code paths warmed
    baseline = _stub_rss_kib(model_dir.parent)
    for index in range(20):
        _swap(server, 2 if index % 2 == 0 else 1)
    assert _status(server)["active_version"] == 1
    assert _stub_rss_kib(model_dir.parent) <= baseline * 1.05
    (instance,) = _status(server)["instances"].values()
    assert instance["draining"] == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_sdk_sends_the_admin_key_triton_expects_on_each_protocol(swap_server, protocol):
    """Over gRPC Triton 2.51 wants the restricted-protocol key as header
    ``triton-grpc-protocol-fastpath-admin-key`` (not ``fastpath-admin-key``), and the SDK sends it so.
    Triton refuses a missing key as UNAVAILABLE; the SDK raises PermissionDeniedError and does not retry."""
    from fastpath_client import Client, PermissionDeniedError

    server, _ = swap_server
    url = server.http_url if protocol == "http" else server.grpc_url
    with Client(url, protocol, admin_key=KEY) as client:
        assert "1" in [v["version"] for v in client.versions("text_embedding")]
    retries = []
    with Client(url, protocol, admin_key="", on_retry=lambda n, e, d: retries.append(e)) as client:
        with pytest.raises(PermissionDeniedError, match="restricted"):
            client.versions("text_embedding")
    assert retries == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wait_ready_without_the_key_names_each_model_state(swap_server, protocol):
    """wait_ready(models=["nope"]) without the admin key does not raise PermissionDeniedError (the
    repository index is restricted): it waits on unrestricted endpoints and names each model's state."""
    from fastpath_client import Client, RequestTimeoutError

    server, _ = swap_server
    url = server.http_url if protocol == "http" else server.grpc_url
    with Client(url, protocol, admin_key="") as client:
        with pytest.raises(RequestTimeoutError) as info:
            client.wait_ready(timeout_s=1.0, models=["nope", "text_embedding"])
        client.wait_ready(timeout_s=10, models=["text_embedding"])
    message = str(info.value)
    assert "'nope' not found" in message and "'text_embedding'" not in message
    assert "admin key" in message

