"""Helpers for live-swap tests and benchmarks: a private model repository, admin calls, load streams."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS = REPO_ROOT / "model_repository"


def link_version(source: Path, target: Path) -> None:
    """A version directory whose large files are symlinks to ``source`` and whose manifest is a copy."""
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.name in ("manifest.json", "model.py", "__pycache__"):
            continue
        (target / path.name).symlink_to(path.resolve())
    shutil.copy(source / "manifest.json", target / "manifest.json")
    shutil.copy(MODELS / "text_embedding" / "1" / "model.py", target / "model.py")


def make_swap_repository(root: Path, versions: dict[int, Path]) -> Path:
    """A model repository with text_embedding (the given versions, each with golden inputs) and fastpath_admin."""
    from fastpath.manifest import read_manifest
    from fastpath.models.text_embedding.config import TextEmbeddingConfig
    from fastpath.models.text_embedding.golden import add_golden
    from fastpath.models.text_embedding.pipeline import TextEmbedder

    repository = root / "repo"
    shutil.copytree(MODELS / "fastpath_admin", repository / "fastpath_admin", ignore=shutil.ignore_patterns("__pycache__"))
    model_dir = repository / "text_embedding"
    model_dir.mkdir(parents=True)
    shutil.copy(MODELS / "text_embedding" / "config.pbtxt", model_dir / "config.pbtxt")
    reference = TextEmbedder.from_directory(MODELS / "text_embedding" / "1", TextEmbeddingConfig())
    try:
        for version, source in versions.items():
            link_version(source, model_dir / str(version))
            (model_dir / str(version) / "golden.npz").unlink(missing_ok=True)  # a link: writing through it would rewrite the source
            precision = read_manifest(source).get("precision", "fp32")
            add_golden(model_dir / str(version), reference, min_cosine=0.9999 if precision == "fp32" else 0.99)
    finally:
        reference.close()
    return repository


def _client_module(protocol: str):
    """tritonclient's module for ``protocol``, imported on use: a gRPC caller needs no HTTP client (gevent)."""
    import importlib

    return importlib.import_module("tritonclient.http" if protocol == "http" else "tritonclient.grpc")


def admin(url: str, command: dict, protocol: str = "http") -> dict:
    """Send one admin command to fastpath_admin; returns the reply or raises InferenceServerException."""
    module = _client_module(protocol)
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("REQUEST", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(command).encode()], dtype=np.object_))
    reply = client.infer("fastpath_admin", [tensor]).as_numpy("RESPONSE")[0]
    return json.loads(reply)


class LoadStreams:
    """``count`` threads sending requests of ``texts_per_request`` texts in a loop (half HTTP, half
    gRPC), recording each result.

    Each record: (stream, sent_s, done_s, latency_s, versions or None, error or None); ``versions``
    is the response's MODEL_VERSION, one per text.
    """

    def __init__(self, http_url: str, grpc_url: str, texts: list[str], count: int = 16, texts_per_request: int = 1) -> None:
        self.http_url, self.grpc_url, self.texts, self.count = http_url, grpc_url, texts, count
        self.texts_per_request = texts_per_request
        self.records: list[tuple] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]

    def _run(self, stream: int) -> None:
        module = _client_module("http" if stream % 2 else "grpc")
        url = self.http_url if stream % 2 else self.grpc_url
        client = module.InferenceServerClient(url)
        outputs = [module.InferRequestedOutput("EMBEDDING"), module.InferRequestedOutput("MODEL_VERSION")]
        index = stream
        while not self._stop.is_set():
            batch = [self.texts[(index + k) % len(self.texts)].encode() for k in range(self.texts_per_request)]
            index += self.count * self.texts_per_request
            tensor = module.InferInput("TEXT", [len(batch), 1], "BYTES")
            tensor.set_data_from_numpy(np.array(batch, dtype=np.object_).reshape(-1, 1))
            sent = time.monotonic()
            try:
                result = client.infer("text_embedding", [tensor], outputs=outputs)
                record = (stream, sent, time.monotonic(), time.monotonic() - sent, result.as_numpy("MODEL_VERSION").reshape(-1).tolist(), None)
            except Exception as exc:  # recorded: the test asserts there are none
                record = (stream, sent, time.monotonic(), time.monotonic() - sent, None, str(exc))
            with self._lock:
                self.records.append(record)

    def __enter__(self) -> LoadStreams:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def snapshot(self) -> list[tuple]:
        with self._lock:
            return list(self.records)
