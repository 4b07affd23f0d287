"""A version whose artifact changed after the build does not load, neither at start nor by a swap.

A same-size file with one flipped byte passes every size check; only its sha256 differs from the
manifest's. Triton must refuse to load the model with FastPath's ArtifactError naming the file and
both checksums, rather than serve outputs of a corrupted network with 200s.
"""

from __future__ import annotations

import shutil

import pytest

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from tests.conftest import MODEL_REPOSITORY, load_refusal, variant_repository

MODELS = {"text_embedding": "model.onnx", "text_detection": "model.onnx"}


def _flip_one_byte(path) -> None:
    """Replace the symlink ``path`` with a copy of its target whose middle byte is inverted (same size)."""
    target = path.resolve()
    path.unlink()
    shutil.copyfile(target, path)
    with open(path, "r+b") as handle:
        handle.seek(target.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_same_size_corrupted_artifact_refuses_to_load_naming_its_checksum(tmp_path, model):
    """Invariant: the file a model loads at start matches its version's manifest.json (size and sha256), or
    loading fails with an ArtifactError naming the file and the two checksums and the model is not ready."""
    if model == "text_detection" and not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)  # what `fastpath build --if-missing` does
    repository = variant_repository(tmp_path, model)
    artifact = repository / model / "1" / MODELS[model]
    _flip_one_byte(artifact)
    assert artifact.stat().st_size == (MODEL_REPOSITORY / model / "1" / MODELS[model]).stat().st_size
    message = load_refusal(tmp_path, repository, model)
    assert "ArtifactError" in message and f"{artifact} fails its checksum" in message, message
    assert "manifest says" in message, message
