"""The external-data copy of an ONNX artifact: same outputs, listed in the manifest, never stale."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fastpath.artifacts.external_data import DATA_NAME, GRAPH_NAME, add_external_data_copy
from fastpath.errors import ArtifactError
from fastpath.manifest import external_data_artifact, read_manifest, verify_manifest, write_manifest


def _save_model(path, seed):
    """A real ONNX model, Y = X @ W + b, with a 64 KiB weight (external) and a small bias (inline)."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((128, 128)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(128).astype(np.float32)[:8].repeat(16), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "b"], ["Y"])], "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 128])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 128])], initializer=[weight, bias])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture
def version(tmp_path):
    _save_model(tmp_path / "model.onnx", seed=0)
    write_manifest(tmp_path, ["model.onnx"], {"artifact": "model.onnx", "precision": "fp32"})
    return tmp_path


def _run(path):
    x = np.random.default_rng(1).standard_normal((3, 128)).astype(np.float32)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]


def test_copy_gives_the_same_outputs_and_is_listed(version):
    assert add_external_data_copy(version) is True
    manifest = verify_manifest(version)
    assert set(manifest["files"]) == {"model.onnx", GRAPH_NAME, DATA_NAME}
    assert manifest["external_data"]["source_sha256"] == manifest["files"]["model.onnx"]
    assert manifest["precision"] == "fp32"  # the rest of the manifest is kept
    assert external_data_artifact(manifest) == GRAPH_NAME
    assert (version / GRAPH_NAME).stat().st_size < 4096 and (version / DATA_NAME).stat().st_size >= 128 * 128 * 4
    np.testing.assert_array_equal(_run(version / GRAPH_NAME), _run(version / "model.onnx"))
    assert add_external_data_copy(version) is False  # current already


def test_a_corrupt_data_file_is_refused(version):
    add_external_data_copy(version)
    data = bytearray((version / DATA_NAME).read_bytes())
    data[100] ^= 0xFF
    (version / DATA_NAME).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"{DATA_NAME} fails its checksum"):
        verify_manifest(version)


def test_a_copy_of_a_replaced_model_is_stale_and_made_again(version):
    add_external_data_copy(version)
    _save_model(version / "model.onnx", seed=2)  # model.onnx replaced and re-listed; the old copy stays listed
    manifest = read_manifest(version)
    write_manifest(version, manifest.pop("files"), manifest)
    assert external_data_artifact(read_manifest(version)) is None
    assert add_external_data_copy(version) is True
    assert external_data_artifact(read_manifest(version)) == GRAPH_NAME
    np.testing.assert_array_equal(_run(version / GRAPH_NAME), _run(version / "model.onnx"))


def test_a_manifest_naming_an_unlisted_copy_gives_none(version):
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["external_data"] = {"file": GRAPH_NAME, "data": DATA_NAME, "source": "model.onnx",
                                 "source_sha256": manifest["files"]["model.onnx"]}
    assert external_data_artifact(manifest) is None


def test_the_copy_has_the_umask_default_mode(version):
    """Invariant: both files of the copy are 0o666 less the umask (onnx writes the data file 0o600), so a server
    running as another user than the build can read them."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        assert add_external_data_copy(version)
    finally:
        os.umask(old)
    assert {name: stat.S_IMODE((version / name).stat().st_mode) for name in (GRAPH_NAME, DATA_NAME)} == {
        GRAPH_NAME: 0o644, DATA_NAME: 0o644}
