"""The fp16 candidates of text_detection's GPU artifact, on the real PP-OCRv4 det model and real photos (CPU only).

The range analysis runs model.onnx on scikit-image's photos; the chooser's block list follows from those ranges and
the model's weights; the written models load in ONNX Runtime with uint8 in and float32 out, their kept nodes in
float32; the CPU emulation of fp16 shows why the naive conversion fails and what keeping one node fixes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, shape_inference

from fastpath.artifacts import detection_fp16 as fp16
from fastpath.artifacts.fp16_graph import constants_to_initializers, emulated_fp16, float_activations
from fastpath.errors import ArtifactError
from fastpath.models.text_detection.config import UINT8_ARTIFACT
from fastpath.models.text_detection.preprocess import resize_image
from tests.conftest import MODEL_REPOSITORY

VERSION_DIR = MODEL_REPOSITORY / "text_detection" / "1"


@pytest.fixture(scope="module")
def artifacts():
    """(model.onnx, model.uint8.onnx) of the built text_detection version 1."""
    paths = (VERSION_DIR / "model.onnx", VERSION_DIR / UINT8_ARTIFACT)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        pytest.skip(f"text_detection/1 is not built ({', '.join(missing)} missing): run 'fastpath build --if-missing'")
    return paths


@pytest.fixture(scope="module")
def images():
    try:
        return fp16.analysis_images()
    except ArtifactError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def ranges(artifacts, images):
    return fp16.measure_ranges(artifacts[0], images)


@pytest.fixture(scope="module")
def uint8_model(artifacts):
    return onnx.load(str(artifacts[1]))


def test_range_analysis_reports_a_finite_positive_maximum_for_every_float_activation(artifacts, ranges):
    """Invariant: every float32 node output of model.onnx is reported once, with 0 < max |x| < inf and finite
    values, under its producer's name; on the served photos the DB head's first conv is the one above 2^14."""
    model = onnx.load(str(artifacts[0]))
    expected = {tensor: (node, op) for tensor, node, op in float_activations(model)}
    assert set(ranges) == set(expected) and len(ranges) > 300
    for tensor, found in ranges.items():
        assert found.finite and 0.0 < found.max_abs < math.inf, (tensor, found)
        assert (found.node, found.op_type) == expected[tensor]
    assert [t for t, r in ranges.items() if r.max_abs > fp16.FP16_SAFE_BOUND] == ["conv2d_497.tmp_0"]
    assert ranges["conv2d_497.tmp_0"].max_abs < fp16.FP16_MAX  # representable, within 4x of overflowing
    assert ranges["sigmoid_0.tmp_0"].max_abs <= 1.0


def test_the_chooser_keeps_the_nodes_above_the_bound_and_a_lower_bound_keeps_more(uint8_model, ranges):
    """On the analysis photos only the head's conv (~29,000, its output) and BatchNormalization (variance 1e7-1e8,
    its weight) exceed 2^14; a lower bound keeps a superset in graph order, without repeats or Constants."""
    assert fp16.choose_fp32_nodes(uint8_model, ranges, fp16.FP16_SAFE_BOUND) == ["p2o.Conv.61", "p2o.BatchNormalization.1"]
    lower = fp16.choose_fp32_nodes(uint8_model, ranges, 1024.0)
    order = [node.name for node in uint8_model.graph.node]
    assert {"p2o.Conv.61", "p2o.BatchNormalization.1"} < set(lower)
    assert lower == sorted(set(lower), key=order.index)
    assert not {node.name for node in uint8_model.graph.node if node.op_type == "Constant"} & set(lower)


def test_a_tensor_that_was_not_finite_keeps_its_producer_and_consumers_in_float32(uint8_model, ranges):
    """A tensor whose fp32 values held an inf or NaN (``finite`` False, ``max_abs`` inf) blocks every node touching it."""
    broken = dict(ranges)
    broken["p2o.Add.215"] = dataclasses.replace(ranges["p2o.Add.215"], max_abs=math.inf, finite=False)
    chosen = fp16.choose_fp32_nodes(uint8_model, broken, fp16.FP16_SAFE_BOUND)
    assert chosen == ["p2o.Add.214", "p2o.Conv.36", "p2o.Conv.61", "p2o.BatchNormalization.1"]


def test_the_chooser_keeps_the_head_batchnorm_for_its_variance_and_its_conv_for_its_output(uint8_model, ranges):
    """What the analysis found: the running variance of p2o.BatchNormalization.1 (1e7-1e8) is no fp16 value; the
    conv before it reaches ~29,000 on the served photos, above 2^14."""
    assert fp16.weight_maxima(uint8_model)["batch_norm_0.w_2"] > fp16.FP16_MAX
    assert fp16.choose_fp32_nodes(uint8_model, ranges, fp16.FP16_MAX) == ["p2o.BatchNormalization.1"]
    assert fp16.candidate_block_list("range", uint8_model, ranges) == ["p2o.Conv.61", "p2o.BatchNormalization.1"]
    backbone = fp16.candidate_block_list("range_backbone", uint8_model, ranges)
    assert backbone[0] == "fastpath_cast" and "p2o.Add.214" in backbone and "p2o.Conv.33" not in backbone
    assert backbone[-2:] == ["p2o.Conv.61", "p2o.BatchNormalization.1"]
    with pytest.raises(ArtifactError, match="unknown fp16 candidate"):
        fp16.candidate_block_list("everything", uint8_model, ranges)


@pytest.mark.parametrize("candidate", fp16.DEFAULT_CANDIDATES)
def test_a_written_candidate_loads_with_uint8_in_float32_out_and_its_kept_nodes_in_float32(
        artifacts, uint8_model, ranges, images, tmp_path, candidate):
    """The written model passes onnx.checker, loads in ONNX Runtime's CPU EP (uint8 [B, H, W, 3] in, float32
    [B, 1, H, W] out, a probability map for a real photo); every kept node reads and writes float32 (weights
    included) and no tensor between two kept nodes goes through fp16; every other float node computes in fp16."""
    block = fp16.candidate_block_list(candidate, uint8_model, ranges)
    path = fp16.write_fp16(artifacts[1], fp16.candidate_path(tmp_path, candidate), block)
    assert path.name == f"model.uint8.fp16.{candidate}.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (feed,), (out,) = session.get_inputs(), session.get_outputs()
    assert (feed.type, out.type) == ("tensor(uint8)", "tensor(float)")
    prob_map = session.run(None, {feed.name: resize_image(images[1], (160, 320))[None]})[0]
    assert prob_map.shape == (1, 1, 160, 320) and prob_map.dtype == np.float32
    assert np.isfinite(prob_map).all() and prob_map.min() >= 0.0 and prob_map.max() <= 1.0

    inferred = shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    types |= {t.name: t.data_type for t in model.graph.initializer}
    kept, produced_by = set(block), {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        float_types = {types[t] for t in [*node.input, *node.output] if types.get(t) in (TensorProto.FLOAT, TensorProto.FLOAT16)}
        if node.name in kept:
            assert float_types <= {TensorProto.FLOAT}, node.name
        elif node.op_type != "Cast" and float_types:
            assert TensorProto.FLOAT16 in {types.get(o) for o in node.output}, node.name
        if node.op_type == "Cast" and types.get(node.output[0]) == TensorProto.FLOAT and node.input[0] in produced_by:
            up = produced_by[node.input[0]]
            assert not (up.op_type == "Cast" and produced_by.get(up.input[0], up).name in kept), node.name


def test_fp16_emulation_shows_the_naive_map_broken_and_the_kept_batchnorm_fixing_it(artifacts, uint8_model, images):
    """On a real photo, emulated fp16 (fp16 storage and weights, float32 arithmetic): nothing in fp16 gives the
    float32 map bit for bit; the naive conversion (nothing kept) moves the map by > 0.02 on average (its clamped
    BatchNormalization variance); keeping p2o.BatchNormalization.1 in float32 brings it within 1e-3."""
    model = onnx.load(str(artifacts[1]))
    constants_to_initializers(model)
    floats = [t for t, _, _ in float_activations(model)]
    feed = {model.graph.input[0].name: resize_image(images[1], (320, 640))[None]}
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]

    def emulated_map(kept):
        emulated = emulated_fp16(model, kept, floats).SerializeToString()
        return ort.InferenceSession(emulated, providers=["CPUExecutionProvider"]).run(None, feed)[0]

    everything = {n.name for n in model.graph.node}
    np.testing.assert_array_equal(emulated_map(everything), reference)
    assert np.abs(emulated_map(set()) - reference).mean() > 0.02
    assert np.abs(emulated_map({"p2o.BatchNormalization.1"}) - reference).mean() < 1e-3


def test_emulation_rounds_a_float32_node_output_only_where_an_fp16_node_reads_it():
    """Invariant of emulated_fp16: a kept (float32) node's output passes through fp16 where a node outside the kept
    set reads it (the converter's Cast at that boundary), and stays float32 where only kept nodes read it.
    x = 1 + 2^-13 survives float32 but rounds to 1.0 in fp16 (10 mantissa bits)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from fastpath.artifacts.fp16_graph import emulated_fp16

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["a"], name="A"), helper.make_node("Identity", ["a"], ["y"], name="B")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([1.0 + 2.0**-13], dtype=np.float32)

    def run(kept):
        emulated = emulated_fp16(model, kept, ["a"])  # y, the graph output, stays float32 here
        session = ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(["y"], {"x": x})[0][0]

    assert run({"A", "B"}) == x[0]  # both float32: nothing rounds
    assert run({"A"}) == 1.0  # A float32, B fp16: A's output crosses into fp16
    assert run(set()) == 1.0
