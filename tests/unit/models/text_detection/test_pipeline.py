"""TextDetector: the built artifact against rapidocr in-process, batching, and artifact checks."""

import json

import numpy as np
import pytest

from fastpath.artifacts.detection import build_text_detection, source_model_path
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import ArtifactError, EngineError
from fastpath.manifest import verify_manifest
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.pipeline import Detection, TextDetector, concatenate, plan_batches
from tests.unit.models.text_detection.reference import assert_matches_reference, reference_boxes, skimage_rgb

CONFIG = TextDetectionConfig(intra_op_threads=1)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repository")
    build_text_detection(repository)
    return repository


@pytest.fixture(scope="module")
def detector(repository):
    detector = TextDetector.from_directory(repository / "text_detection" / "1", CONFIG)
    yield detector
    detector.close()


def test_build_copies_the_wheel_model_with_a_manifest(repository):
    manifest = verify_manifest(repository / "text_detection" / "1")
    assert manifest["source"]["package"] == "rapidocr-onnxruntime"
    assert manifest["files"]["model.onnx"] == manifest["source"]["sha256"]
    assert (repository / "text_detection" / "1" / "model.onnx").read_bytes() == source_model_path().read_bytes()
    assert json.loads((repository / "text_detection" / "1" / "manifest.json").read_text())["artifact"] == "model.onnx"


@pytest.mark.parametrize(
    ("name", "scale", "expected_boxes"),
    [("page.png", 1.0, 5), ("page.png", 3.0, 6), ("text.png", 2.0, 1), ("coffee.png", 1.0, 1), ("astronaut.png", 1.0, 0)],
)
def test_boxes_equal_rapidocr_in_process(detector, name, scale, expected_boxes):
    image = skimage_rgb(name, scale)
    (detection,) = detector.detect([image])
    reference = reference_boxes(image, CONFIG.limit_type, CONFIG.limit_side_len_px)  # max/960, the code default
    assert len(reference) == expected_boxes
    assert_matches_reference(detection.boxes, reference)
    for box in reference:  # same pixels in, so the very same integer corners out
        assert sum(np.array_equal(box, served) for served in detection.boxes) == 1
    assert detection.scores.shape == (expected_boxes,) and (detection.scores >= CONFIG.box_threshold).all()


def test_batched_results_equal_single_results(detector):
    page = skimage_rgb("page.png")
    images = [page, np.full((191, 384, 3), 255, np.uint8), page[:, ::-1].copy(), skimage_rgb("text.png", 2.0), page]
    batched = detector.detect(images)
    assert [len(d.boxes) for d in batched][:2] == [5, 0]
    for image, together in zip(images, batched):
        (alone,) = detector.detect([image])
        np.testing.assert_array_equal(together.boxes, alone.boxes)
        np.testing.assert_array_equal(together.scores, alone.scores)


def test_plan_batches_groups_by_shape_and_cuts_at_max_batch():
    shapes = [(32, 64), (64, 64), (32, 64), (32, 64), (64, 64)]
    assert plan_batches(shapes, 2) == [[0, 2], [3], [1, 4]]
    assert plan_batches([], 8) == []


def test_run_batch_refuses_mixed_shapes(detector):
    prepared = [detector.prepare(np.zeros((40, 40, 3), np.uint8)), detector.prepare(np.zeros((100, 40, 3), np.uint8))]
    with pytest.raises(EngineError, match="one resized shape"):
        detector.run_batch(prepared)


def test_concatenate_is_ragged_and_typed():
    empty = Detection(np.zeros((0, 4, 2), np.float32), np.zeros((0,), np.float32))
    two = Detection(np.ones((2, 4, 2), np.float32), np.array([0.6, 0.7], np.float32))
    boxes, scores, counts = concatenate([empty, two, empty])
    assert boxes.shape == (2, 4, 2) and scores.tolist() == pytest.approx([0.6, 0.7]) and counts.tolist() == [0, 2, 0]
    boxes, scores, counts = concatenate([empty])
    assert (boxes.shape, boxes.dtype, scores.shape, scores.dtype, counts.tolist()) == ((0, 4, 2), np.float32, (0,), np.float32, [0])


def _toy_detector_onnx(path, input_shape):
    """An ONNX graph x [input_shape] -> mean over channels [.., 1, .., ..] (a stand-in detector head)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))
    out_shape = [input_shape[0], 1, input_shape[2], input_shape[3]]
    y = helper.make_tensor_value_info("prob", TensorProto.FLOAT, out_shape)
    node = helper.make_node("ReduceMean", ["x"], ["prob"], axes=[1], keepdims=1)
    model = helper.make_model(helper.make_graph([node], "toy", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_fixed_batch_and_size_artifact_is_refused_listing_shapes(tmp_path):
    """A detector exported with batch 1 and 640x640 cannot serve batching and dynamic sizes."""
    engine = OnnxRuntimeEngine(str(_toy_detector_onnx(tmp_path / "fixed.onnx", [1, 3, 640, 640])))
    with pytest.raises(ArtifactError, match=r"height and width must be dynamic.*batch is fixed at 1 but config "
                                            r"max_batch_images = 8.*artifact inputs \[\('x', \[1, 3, 640, 640\]\)\]"):
        TextDetector(engine, CONFIG)


def test_dynamic_toy_artifact_is_accepted_and_runs(tmp_path):
    engine = OnnxRuntimeEngine(str(_toy_detector_onnx(tmp_path / "dynamic.onnx", ["b", 3, "h", "w"])))
    toy = TextDetector(engine, CONFIG)
    (detection,) = toy.detect([np.zeros((50, 70, 3), np.uint8)])  # all pixels normalize to -1: no text
    assert detection.boxes.shape == (0, 4, 2)


def test_a_gpu_artifact_missing_from_the_version_directory_is_named_before_any_engine_loads(repository):
    """On a GPU the detector loads config.gpu_artifact from the version directory; a name that is not there fails
    with ArtifactError naming that file (the CPU path's model.onnx beside it does not stand in)."""
    config = TextDetectionConfig(gpu_artifact="model.uint8.fp16.range_backbone.onnx")
    with pytest.raises(ArtifactError, match=r"model\.uint8\.fp16\.range_backbone\.onnx is missing"):
        TextDetector.from_directory(repository / "text_detection" / "1", config, device="cuda:0")
