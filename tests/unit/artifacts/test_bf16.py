"""Version 2's torch-runtime artifact: cast from the fp32 weights, gated, added to a built version 2 without
quantizing it again, and refused when it would come from other weights or miss its gate."""

import json
import logging
import os
import shutil

import pytest
import torch

from fastpath.artifacts import bf16
from fastpath.artifacts.export import source_model_dir
from fastpath.cli.main import main
from fastpath.engines.torch.weights import load_weights
from fastpath.errors import AccuracyGateError, ArtifactError
from fastpath.manifest import read_manifest, verify_manifest
from tests.conftest import MODEL_REPOSITORY


def link_files(source, target, skip=()):
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and path.name not in skip:
            try:
                os.link(path, target / path.name)  # hard links: no copy of 300 MB
            except OSError:  # another filesystem
                shutil.copyfile(path, target / path.name)


@pytest.fixture
def repository(tmp_path):
    """A model repository whose version 2 is the built INT8 version as it was before it had bf16 weights."""
    if not (MODEL_REPOSITORY / "text_embedding" / "2" / bf16.BF16_ARTIFACT).is_file():
        pytest.skip("text_embedding/2 is not built with its bf16 weights: run 'fastpath build --if-missing --int8'")
    link_files(MODEL_REPOSITORY / "text_detection" / "1", tmp_path / "text_detection" / "1")
    link_files(MODEL_REPOSITORY / "text_embedding" / "1", tmp_path / "text_embedding" / "1")
    version_2 = tmp_path / "text_embedding" / "2"
    link_files(MODEL_REPOSITORY / "text_embedding" / "2", version_2, skip=(bf16.BF16_ARTIFACT, "manifest.json"))
    manifest = read_manifest(MODEL_REPOSITORY / "text_embedding" / "2")
    del manifest["artifacts"]["torch"], manifest["golden"]["min_cosine_by_runtime"], manifest["accuracy"]["torch"]
    del manifest["torch_weights"], manifest["files"][bf16.BF16_ARTIFACT], manifest["sizes"][bf16.BF16_ARTIFACT]
    (version_2 / "manifest.json").write_text(json.dumps(manifest))
    verify_manifest(version_2)
    return tmp_path


def test_build_if_missing_adds_bf16_weights_to_an_int8_version_without_quantizing_again(repository, caplog):
    """`fastpath build --if-missing --int8` on a version 2 without bf16 weights: the INT8 files stay as they
    were (same inode), the bf16 file is the package's fp32 weights cast to bf16 (not version 1's fp16 ones), and
    the manifest lists it for torch at bf16 with its gate and its measured cosines; a second run changes nothing."""
    version_2 = repository / "text_embedding" / "2"
    int8_inode = (version_2 / "model.onnx").stat().st_ino
    caplog.set_level(logging.INFO, logger="fastpath")
    assert main(["build", "--if-missing", "--int8", "--model-repository", str(repository)]) == 0
    assert "text_embedding version 2 (int8) present and verified" in caplog.text
    assert (version_2 / "model.onnx").stat().st_ino == int8_inode
    manifest = verify_manifest(version_2, required=(bf16.BF16_ARTIFACT, "model.onnx"))
    assert manifest["artifacts"]["torch"] == {"file": bf16.BF16_ARTIFACT, "precision": "bf16"}
    assert manifest["artifacts"]["onnxruntime"]["precision"] == "int8 QDQ" and manifest["precision"] == "int8"
    assert manifest["golden"]["min_cosine"] == 0.99 and manifest["golden"]["min_cosine_by_runtime"] == {"torch": 0.999}
    reports = [manifest["accuracy"]["torch"]["golden"], *manifest["accuracy"]["torch"]["heldout"].values()]
    assert all(0.999 <= r["min_cosine"] < 1.0 and r["mean_cosine"] >= 0.9995 and r["passed"] for r in reports)
    assert manifest["torch_weights"]["weights_sha256"] == read_manifest(repository / "text_embedding" / "1")["source"]["weights_sha256"]

    _, written = load_weights(version_2 / bf16.BF16_ARTIFACT)
    _, fp32 = load_weights(source_model_dir() / "model.safetensors")
    _, fp16 = load_weights(repository / "text_embedding" / "1" / "model.fp16.safetensors")
    assert all(t.dtype == torch.bfloat16 and torch.equal(t, fp32[name].to(torch.bfloat16)) for name, t in written.items())
    assert any(not torch.equal(t, fp16[name].to(torch.bfloat16)) for name, t in written.items())  # fp16 first would differ

    written_at = (version_2 / bf16.BF16_ARTIFACT).stat().st_mtime_ns
    caplog.clear()
    assert main(["build", "--if-missing", "--int8", "--model-repository", str(repository)]) == 0
    assert "bf16 weights (torch runtime) present and verified" in caplog.text
    assert (version_2 / bf16.BF16_ARTIFACT).stat().st_mtime_ns == written_at


def test_weights_other_than_version_1s_source_are_refused(repository):
    """Version 1's fp16 file is not the fp32 weights it was exported from: refused before anything is cast."""
    fp16 = repository / "text_embedding" / "1" / "model.fp16.safetensors"
    with pytest.raises(ArtifactError, match=r"model.fp16.safetensors has sha256 .*, but version 1 was exported from weights "
                                            r"with sha256 53aa51172d142c89\.\.\.; rebuild version 1"):
        bf16.add_bf16_weights(repository / "text_embedding", weights=fp16)
    assert not (repository / "text_embedding" / "2" / bf16.BF16_ARTIFACT).exists()


def test_bf16_weights_that_miss_the_gate_are_not_written(repository, monkeypatch):
    """A gate above what bf16 reaches (0.99999): the build fails naming the shortfall, and version 2's files and
    manifest are as before (no bf16 file, no torch entry, no staging directory left behind)."""
    version_2 = repository / "text_embedding" / "2"
    before = (version_2 / "manifest.json").read_bytes()
    monkeypatch.setattr(bf16, "MIN_COSINE", 0.99999)
    with pytest.raises(AccuracyGateError, match=r"fails the accuracy gate against fp32 on held-out text: .*min cosine 0\.99\d+ < 0\.99999"):
        bf16.add_bf16_weights(repository / "text_embedding", progress=lambda iterable, _label: iterable)
    assert (version_2 / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in version_2.iterdir()) == sorted([*read_manifest(version_2)["files"], "manifest.json"])
