"""What the GPU path of text_detection computes on the host, checked on the CPU with the real artifacts.

* ``model.uint8.onnx`` (uint8 RGB [B, H, W, 3] in, normalized inside the graph) gives the very same
  probability maps as ``model.onnx`` fed the CPU path's normalized BGR planes: the front is a lookup of the
  same 256 float32 values, so the GPU engine computes the CPU path's function.
* ``stage_padded`` puts each resized image at the top-left of its row, black (0) to the bottom and right,
  and filler rows are copies of row 0; an image larger than the bucket is refused.
* Shape buckets snap each side up to the next bucket side, keep a side above the largest, and the model's
  queue key falls back to the exact shape when the padded bucket exceeds ``max_resized_pixels``.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from fastpath.artifacts.detection import build_text_detection
from fastpath.errors import ConfigError, EngineError
from fastpath.graphs import ImageSideBuckets
from fastpath.models.text_detection.config import UINT8_ARTIFACT, TextDetectionConfig
from fastpath.models.text_detection.device_batches import stage_padded
from fastpath.models.text_detection.pipeline import PreparedImage, TextDetector
from tests.unit.models.text_detection.reference import skimage_rgb


@pytest.fixture(scope="module")
def version_dir(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repository")
    build_text_detection(repository)
    return repository / "text_detection" / "1"


def test_uint8_front_computes_the_cpu_paths_maps_bit_for_bit(version_dir):
    detector = TextDetector.from_directory(version_dir, TextDetectionConfig(intra_op_threads=1))
    front = ort.InferenceSession(str(version_dir / UINT8_ARTIFACT), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in front.get_inputs()] == [("image", "tensor(uint8)")]
    images = [detector.prepare(skimage_rgb("text.png")[:96, :160]), detector.prepare(skimage_rgb("astronaut.png")[:96, :160])]
    expected = detector.run_batch(images)
    got = front.run(None, {"image": np.stack([image.resized for image in images])})[0][:, 0]
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    detector.close()


def prepared(height: int, width: int, value: int) -> PreparedImage:
    return PreparedImage(np.full((height, width, 3), value, np.uint8), (height, width))


def test_stage_padded_places_images_top_left_pads_black_and_copies_row_0_into_filler_rows():
    out = np.full((4, 64, 96, 3), 7, np.uint8)  # leftovers of an earlier batch must not survive
    stage_padded([prepared(32, 64, 200), prepared(64, 96, 100)], out)
    assert (out[0, :32, :64] == 200).all() and (out[0, 32:] == 0).all() and (out[0, :32, 64:] == 0).all()
    assert (out[1] == 100).all()
    np.testing.assert_array_equal(out[2], out[0])
    np.testing.assert_array_equal(out[3], out[0])


def test_stage_padded_refuses_an_image_larger_than_its_bucket_or_more_images_than_rows():
    with pytest.raises(EngineError, match="does not fit the bucket 64x64"):
        stage_padded([prepared(96, 32, 1)], np.zeros((1, 64, 64, 3), np.uint8))
    with pytest.raises(EngineError, match="needs 1..1 images; got 2"):
        stage_padded([prepared(32, 32, 1)] * 2, np.zeros((1, 64, 64, 3), np.uint8))


def test_side_buckets_snap_up_and_keep_sides_above_the_largest():
    buckets = ImageSideBuckets((1312, 736, 992))
    assert buckets.sides_px == (736, 992, 1312)
    assert buckets.snap((736, 1280)) == (736, 1312)
    assert buckets.snap((704, 2848)) == (736, 2848)  # above the largest: its own size, no graph
    assert buckets.has_graph((736, 1312)) and not buckets.has_graph((736, 2848))
    assert ImageSideBuckets(()).snap((736, 1280)) == (736, 1280)
    with pytest.raises(ConfigError, match="not positive multiples of 32"):
        ImageSideBuckets((736, 1000))
