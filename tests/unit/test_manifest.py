"""Manifest and checksum verification: tampered, truncated, grown, missing and unlisted files are refused."""

import json
import re
import shutil

import pytest

from fastpath.errors import ArtifactError
from fastpath.manifest import read_manifest, verify_manifest, write_manifest
from tests.conftest import MODEL_REPOSITORY


@pytest.fixture
def version(tmp_path):
    (tmp_path / "model.onnx").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "tokenizer.json").write_text('{"model": "wordpiece"}')
    write_manifest(tmp_path, ["model.onnx", "tokenizer.json"], {"precision": "int8"})
    return tmp_path


def test_a_clean_version_verifies_and_records_sizes(version):
    manifest = verify_manifest(version, required=("model.onnx",))
    assert manifest["precision"] == "int8"
    assert manifest["sizes"] == {"model.onnx": 16384, "tokenizer.json": 22}
    assert len(manifest["files"]["model.onnx"]) == 64


def test_a_tampered_file_is_refused(version):
    data = bytearray((version / "model.onnx").read_bytes())
    data[1000] ^= 0xFF  # same size, one byte changed
    (version / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"model.onnx fails its checksum: sha256 [0-9a-f]{16}\.\.\., manifest says"):
        verify_manifest(version)


def test_a_truncated_file_is_refused_as_truncated(version):
    with open(version / "model.onnx", "r+b") as handle:
        handle.truncate(4096)
    with pytest.raises(ArtifactError, match="model.onnx is 4096 bytes; manifest.json says 16384: the file is truncated"):
        verify_manifest(version)


def test_a_grown_file_is_refused(version):
    with open(version / "tokenizer.json", "ab") as handle:
        handle.write(b" ")
    with pytest.raises(ArtifactError, match="larger than built"):
        verify_manifest(version)


def test_missing_unlisted_and_escaping_files_are_refused(version):
    with pytest.raises(ArtifactError, match="golden.npz is not listed in manifest.json"):
        verify_manifest(version, required=("golden.npz",))
    (version / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="tokenizer.json is listed in manifest.json but missing"):
        verify_manifest(version)
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["files"] = {"../config.pbtxt": "0" * 64}
    (version / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="outside its directory"):
        verify_manifest(version)
    (version / "manifest.json").write_text(json.dumps({"files": {}}))
    with pytest.raises(ArtifactError, match="lists no files"):
        verify_manifest(version)


def test_a_partial_copy_verifies_only_what_it_needs(version):
    (version / "model.onnx").unlink()  # e.g. a GPU host that got the tokenizer and the torch weights only
    assert verify_manifest(version, required=("tokenizer.json",), only_required=True)["precision"] == "int8"
    with pytest.raises(ArtifactError, match="model.onnx is listed in manifest.json but missing"):
        verify_manifest(version, required=("tokenizer.json",))


def test_manifests_without_sizes_still_verify_by_checksum(version):
    manifest = json.loads((version / "manifest.json").read_text())
    del manifest["sizes"]  # written before sizes were recorded
    (version / "manifest.json").write_text(json.dumps(manifest))
    assert verify_manifest(version)["precision"] == "int8"


@pytest.mark.parametrize(("version_number", "files"), [
    (1, {"model.onnx", "model.external.onnx", "model.external.onnx.data", "model.fp16.safetensors", "tokenizer.json", "golden.npz"}),
    (2, {"model.onnx", "model.external.onnx", "model.external.onnx.data", "model.bf16.safetensors", "tokenizer.json", "golden.npz",
         "model.py"}),
])
def test_the_built_versions_verify(version_number, files):
    directory = MODEL_REPOSITORY / "text_embedding" / str(version_number)
    if not (directory / "manifest.json").exists():
        pytest.skip(f"{directory} is not built: run 'fastpath build --int8' (make test does)")
    manifest = verify_manifest(directory, required=tuple(files))
    assert set(manifest["files"]) == files
    assert manifest["precision"] == ("fp32" if version_number == 1 else "int8")
    accuracy = manifest["accuracy"]
    if version_number == 1:  # each runtime of the fp32 version against the reference
        assert all(report["passed"] for report in accuracy.values())
    else:  # the gate, and each kind of held-out text on its own; the same for the torch runtime's bf16 weights
        reports = [accuracy["evaluation"], accuracy["golden"], *accuracy["heldout"].values()]
        assert all(report["passed"] for report in reports)
        assert set(accuracy["heldout"]) >= {"repeated", "blank", "multilingual", "emoji", "code"}
        bf16 = [accuracy["torch"]["golden"], *accuracy["torch"]["heldout"].values()]
        assert all(report["passed"] and report["required_min_cosine"] == 0.999 for report in bf16)
        assert set(accuracy["torch"]["heldout"]) == set(accuracy["heldout"])
        assert manifest["artifacts"]["torch"] == {"file": "model.bf16.safetensors", "precision": "bf16"}


def test_a_truncated_copy_of_the_real_artifact_is_refused(tmp_path):
    source = MODEL_REPOSITORY / "text_embedding" / "1"
    for name in ("manifest.json", "tokenizer.json", "golden.npz", "model.fp16.safetensors", "model.external.onnx", "model.external.onnx.data"):
        shutil.copyfile(source / name, tmp_path / name)
    with open(source / "model.onnx", "rb") as handle, open(tmp_path / "model.onnx", "wb") as out:
        out.write(handle.read(1 << 20))  # an interrupted copy
    with pytest.raises(ArtifactError, match="model.onnx is 1048576 bytes; manifest.json says .*truncated"):
        verify_manifest(tmp_path)


def test_checksum_cache_hashes_an_unchanged_file_once(version):
    from fastpath.manifest import ChecksumCache, sha256_file

    cache = ChecksumCache()
    first = verify_manifest(version, checksums=cache)
    assert verify_manifest(version, checksums=cache) == first
    assert (cache.misses, cache.hits) == (2, 2)
    assert cache.sha256(version / "model.onnx") == sha256_file(version / "model.onnx")


def test_checksum_cache_sees_a_same_size_rewrite_with_the_old_mtime(version):
    """A rewrite in place that restores size and mtime still moves ctime: hashed again, refused."""
    import os

    from fastpath.manifest import ChecksumCache

    cache = ChecksumCache()
    verify_manifest(version, checksums=cache)
    path = version / "model.onnx"
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    with open(path, "r+b") as handle:  # same inode, same size
        handle.write(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_ino == before.st_ino
    with pytest.raises(ArtifactError, match="model.onnx fails its checksum"):
        verify_manifest(version, checksums=cache)


def test_checksum_cache_keeps_at_most_max_entries(tmp_path):
    from fastpath.manifest import ChecksumCache

    cache = ChecksumCache(max_entries=2)
    for index in range(3):
        (tmp_path / f"f{index}").write_bytes(bytes([index]) * 10)
        cache.sha256(tmp_path / f"f{index}")
    cache.sha256(tmp_path / "f0")  # dropped as the oldest: hashed again
    assert (cache.misses, cache.hits) == (4, 0)
    cache.sha256(tmp_path / "f2")
    assert cache.hits == 1


@pytest.mark.parametrize(("content", "expected"), [
    (b"[]", "holds a JSON list, not an object of files and metadata"),
    (b"\xff\xfe{}", "is not valid JSON ('utf-8' codec can't decode byte 0xff"),
])
def test_a_manifest_that_is_no_json_object_is_an_artifact_error_naming_it(tmp_path, content, expected):
    """A manifest of '[]' failed the load with "AttributeError: 'list' object has no attribute 'get'", one not UTF-8
    with a UnicodeDecodeError; neither named manifest.json. Both are ArtifactErrors naming the file."""
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(ArtifactError, match=re.escape(f"{tmp_path / 'manifest.json'} {expected}")):
        read_manifest(tmp_path)
