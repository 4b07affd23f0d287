"""Resize policy and normalization against rapidocr's DetPreProcess."""

import numpy as np
import pytest

from fastpath.models.text_detection.preprocess import normalize_into, resize_image, resized_shape
from tests.unit.models.text_detection.reference import skimage_rgb


@pytest.mark.parametrize(
    ("source_hw", "expected_hw"),
    [
        ((1, 1), (32, 32)),
        ((31, 31), (32, 32)),
        ((33, 50), (32, 64)),
        ((641, 479), (640, 480)),
        ((100, 3000), (32, 960)),
        ((3000, 100), (960, 32)),
        ((8000, 8000), (960, 960)),
        ((191, 384), (192, 384)),
        ((48, 80), (64, 64)),  # Python round(): 1.5 -> 2, 2.5 -> 2 (rapidocr's arithmetic)
        ((960, 960), (960, 960)),
    ],
)
def test_resized_shape_rounds_each_side_to_a_multiple_of_32_within_the_limit(source_hw, expected_hw):
    """Each side is scaled so the longer is at most 960, then rounded to a multiple of 32 (at least 32), as rapidocr does."""
    assert resized_shape(*source_hw, 960) == expected_hw


def test_every_shape_is_a_multiple_of_32_within_the_limit():
    for height in (1, 2, 15, 16, 17, 47, 48, 49, 500, 959, 960, 961, 5000):
        for width in (1, 16, 31, 33, 700, 1919, 20000):
            h, w = resized_shape(height, width, 960)
            assert h % 32 == 0 and w % 32 == 0 and 32 <= h <= 960 and 32 <= w <= 960, (height, width, h, w)


def test_normalized_planes_equal_rapidocr_detpreprocess():
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

    rgb = skimage_rgb("coffee.png")
    expected = DetPreProcess(960, "max", [0.5] * 3, [0.5] * 3)(np.ascontiguousarray(rgb[..., ::-1]))  # rapidocr takes BGR
    shape = resized_shape(*rgb.shape[:2], 960)
    out = np.empty((3,) + shape, np.float32)
    normalize_into(resize_image(rgb, shape), out)
    assert expected.shape == (1,) + out.shape and expected.dtype == np.float32
    np.testing.assert_array_equal(out, expected[0])


def test_resize_keeps_an_image_of_the_right_size():
    rgb = np.zeros((192, 384, 3), np.uint8)
    assert resize_image(rgb, (192, 384)) is rgb
