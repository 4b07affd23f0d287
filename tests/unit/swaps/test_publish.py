"""Atomic publication: a version appears whole or not at all."""

import pytest

from fastpath.errors import ArtifactError
from fastpath.manifest import write_manifest
from fastpath.swaps.publish import publish_version


def _source(tmp_path, payload=b"weights"):
    source = tmp_path / "src"
    source.mkdir()
    (source / "model.onnx").write_bytes(payload)
    write_manifest(source, ["model.onnx"], {"precision": "fp32"})
    return source


def test_publish_creates_version_with_verified_files(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    target = publish_version(_source(tmp_path), model_dir, 2)
    assert target == model_dir / "2" and (target / "model.onnx").read_bytes() == b"weights"
    assert [p.name for p in model_dir.iterdir()] == ["2"]  # no staging directory left behind


def test_corrupt_source_publishes_nothing(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    source = _source(tmp_path)
    (source / "model.onnx").write_bytes(b"weightz")  # changed after the manifest was written
    with pytest.raises(ArtifactError, match="model.onnx fails its checksum"):
        publish_version(source, model_dir, 3)
    assert list(model_dir.iterdir()) == []


def test_existing_version_needs_replace(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    publish_version(_source(tmp_path), model_dir, 1)
    with pytest.raises(ArtifactError, match="already exists"):
        publish_version(tmp_path / "src", model_dir, 1)
    publish_version(tmp_path / "src", model_dir, 1, replace=True)
    assert sorted(p.name for p in model_dir.iterdir()) == ["1"]


def test_version_zero_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match="not a Triton version number"):
        publish_version(_source(tmp_path), tmp_path, 0)


def test_published_version_has_the_umask_default_modes(tmp_path):
    """Invariant: a published version directory is 0o777 and its files 0o666, less the umask, whatever modes the
    source had (tempfile's staging directory is 0o700 and onnx writes external data 0o600), so a server running as
    another user than the publisher can read it."""
    import os
    import stat

    from fastpath.manifest import process_umask

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    source = _source(tmp_path)
    os.chmod(source / "model.onnx", 0o600)
    old = os.umask(0o022)
    try:
        assert process_umask() == 0o022
        target = publish_version(source, model_dir, 2)
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in target.iterdir()} == {"model.onnx": 0o644, "manifest.json": 0o644}
