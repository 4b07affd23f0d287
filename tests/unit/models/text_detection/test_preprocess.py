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


@pytest.mark.parametrize(
    ("source_hw", "expected_hw"),
    [
        ((172, 448), (736, 1920)),  # text.png: 736/172 -> int(1917.02) = 1917 -> round(59.9) * 32
        ((191, 384), (736, 1472)),  # page.png: int(1479.7) = 1479 -> round(46.2) * 32
        ((1, 1), (736, 736)),
        ((48, 80), (736, 1216)),  # int(80 * 15.33) = 1226 -> round(38.3) * 32
        ((736, 1000), (736, 992)),  # shorter side already at the limit: ratio 1, sides only rounded
        ((1000, 2000), (992, 1984)),  # not shrunk (enlarge only); 2000 / 32 = 62.5 rounds to even 62
    ],
)
def test_min_policy_raises_the_shorter_side_to_the_limit_as_paddleocr(source_hw, expected_hw):
    """limit_type "min": ratio = 736 / min(h, w) when min(h, w) < 736, else 1; then PaddleOCR's rounding."""
    assert resized_shape(*source_hw, 736, "min") == expected_hw


@pytest.mark.parametrize(
    ("source_hw", "expected_hw"),
    [
        ((8000, 8000), (1440, 1440)),  # unclamped 8000x8000; sqrt(2097152 / 64e6) = 0.181 -> floor to 32
        ((100, 3000), (256, 7904)),  # unclamped 736x22080 (16 Mpx)
        ((1, 100000), (32, 65536)),  # the 32 px floor: the longer side is held to cap / 32
    ],
)
def test_min_policy_is_clamped_to_max_resized_pixels(source_hw, expected_hw):
    h, w = resized_shape(*source_hw, 736, "min", 2048 * 1024)
    assert (h, w) == expected_hw and h * w <= 2048 * 1024


def test_cap_applies_to_max_policy_too_and_every_shape_stays_on_the_grid():
    assert resized_shape(3000, 3000, 2048, "max", 1024 * 1024) == (1024, 1024)  # unclamped 2048x2048
    for limit_type, limit in (("max", 960), ("min", 736), ("min", 32)):
        for height in (1, 17, 48, 500, 736, 961, 5000):
            for width in (1, 33, 700, 1919, 20000):
                h, w = resized_shape(height, width, limit, limit_type, 2048 * 1024)
                assert h % 32 == 0 and w % 32 == 0 and min(h, w) >= 32 and h * w <= 2048 * 1024, (limit_type, height, width)


def test_unknown_limit_type_is_refused():
    with pytest.raises(ValueError, match="limit_type 'mid': expected one of max, min"):
        resized_shape(10, 10, 736, "mid")
