"""The device-side steps of ``decode_device cuda`` (resize, prepare, stage), run here on torch's CPU device.

The functions take a torch device, so the arithmetic checked here is the arithmetic the GPU runs:

* the bilinear resize matches ``cv2.resize(INTER_LINEAR)`` within one level on every pixel (OpenCV
  rounds a fixed-point result; the device path rounds a float one half up; ~10% of pixels differ), and
  boxes from it match the CPU path's: the same count, every box matched with IoU >= 0.9 (one level
  moves a small box's edge by a pixel of the probability map: 0.94 on text.png, 1.0 on page.png and chelsea.png);
* ``prepare_on_device`` picks exactly the CPU path's resized shape;
* ``stage_on_device`` lays a batch out as ``stage_padded`` does (top-left, black padding, filler rows copy
  row 0), for device tensors and host arrays mixed;
* ``decode_device`` takes cpu or cuda only, and cuda on a CPU instance is refused at load, by name.
nvJPEG itself needs a GPU: tests/gpu/test_detection_cuda.py.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from fastpath.errors import ConfigError, EngineError
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.device_batches import stage_on_device, stage_padded
from fastpath.models.text_detection.model import TextDetectionModel
from fastpath.models.text_detection.pipeline import PreparedImage, TextDetector
from tests.unit.models.text_detection.reference import skimage_rgb

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[build]')")
from fastpath.models.text_detection.device_decode import prepare_on_device, resize_on_device  # noqa: E402

CONFIG = TextDetectionConfig(limit_type="min", limit_side_len_px=736, intra_op_threads=1)


def chw(image: np.ndarray):
    return torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1)


@pytest.mark.parametrize("name", ["astronaut.png", "rocket.jpg", "page.png", "text.png"])
@pytest.mark.parametrize("scale", [1.7, 0.4, 1.0])
def test_device_resize_is_opencvs_bilinear_within_one_level(name, scale):
    image = skimage_rgb(name)
    shape = (max(32, int(image.shape[0] * scale) // 32 * 32), max(32, int(image.shape[1] * scale) // 32 * 32))
    expected = cv2.resize(image, (shape[1], shape[0]), interpolation=cv2.INTER_LINEAR)
    got = resize_on_device(chw(image), shape)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (*shape, 3) and got.is_contiguous()
    assert np.abs(got.numpy().astype(int) - expected.astype(int)).max() <= 1


def test_an_image_already_at_its_shape_is_only_laid_out_channels_last():
    image = skimage_rgb("astronaut.png")[:64, :96]
    np.testing.assert_array_equal(resize_on_device(chw(image), (64, 96)).numpy(), image)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    inter, _ = cv2.intersectConvexConvex(a.astype(np.float32), b.astype(np.float32))
    return inter / (cv2.contourArea(a.astype(np.float32)) + cv2.contourArea(b.astype(np.float32)) - inter)


@pytest.fixture(scope="module")
def detector():
    from fastpath.cli.common import DEFAULT_REPOSITORY

    detector = TextDetector.from_directory(DEFAULT_REPOSITORY / "text_detection" / "1", CONFIG)
    yield detector
    detector.close()


@pytest.mark.parametrize("name", ["text.png", "page.png", "chelsea.png"])
def test_boxes_from_the_device_resize_equal_the_cpu_paths(detector, name):
    image = skimage_rgb(name)
    expected = detector.prepare(image)
    device = prepare_on_device(chw(image), CONFIG)
    assert device.shape_hw == expected.shape_hw and device.source_hw == expected.source_hw
    host = PreparedImage(device.resized.numpy(), device.source_hw)
    (reference,) = [detector.finish(expected, detector.run_batch([expected])[0])]
    got = detector.finish(host, detector.run_batch([host])[0])
    assert len(got.boxes) == len(reference.boxes) > 0
    for box in reference.boxes:
        assert max(iou(box, other) for other in got.boxes) >= 0.9


def test_stage_on_device_lays_out_a_batch_as_stage_padded_does():
    images = [np.full((32, 64, 3), 200, np.uint8), np.full((64, 96, 3), 100, np.uint8)]
    expected = stage_padded([PreparedImage(image, image.shape[:2]) for image in images], np.full((4, 64, 96, 3), 7, np.uint8))
    mixed = [PreparedImage(torch.from_numpy(images[0]), images[0].shape[:2]), PreparedImage(images[1], images[1].shape[:2])]
    got = stage_on_device(mixed, 4, (64, 96), torch.device("cpu"))
    np.testing.assert_array_equal(got.numpy(), expected)
    with pytest.raises(EngineError, match="does not fit the bucket 32x32"):
        stage_on_device(mixed[:1], 1, (32, 32), torch.device("cpu"))


def test_decode_device_takes_cpu_or_cuda_and_cuda_needs_a_gpu_instance():
    with pytest.raises(ConfigError, match=r"'decode_device'.*'gpu'.*one of cpu, cuda"):
        TextDetectionConfig(decode_device="gpu")
    model = object.__new__(TextDetectionModel)
    model.config, model.gpu, model.device = TextDetectionConfig(decode_device="cuda"), False, "cpu"
    with pytest.raises(ConfigError, match="'decode_device' = cuda needs a KIND_GPU instance .* runs on cpu; set decode_device to cpu"):
        model._device_decoder()
    model.config = TextDetectionConfig()
    assert model._device_decoder() is None
