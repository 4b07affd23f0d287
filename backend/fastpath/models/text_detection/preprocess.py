"""Detector input: resize to a multiple of 32, normalize, lay out as BGR planes (PP-OCR trains on OpenCV's BGR).

Resize: PaddleOCR ``ppocr/data/imaging/operators.py`` ``DetResizeForTest.resize_image_type0`` (rapidocr-onnxruntime
1.4.4 ``ch_ppocr_det/utils.py`` ``DetPreProcess``) with its two ``limit_type`` policies, a floor of 32 pixels per
side and FastPath's cap on resized pixels; then bilinear ``cv2.resize`` on uint8 and ``(pixel / 255 - 0.5) / 0.5``:

    limit_type "max": ratio = limit / max(h, w) if max(h, w) > limit else 1   # shrink only
    limit_type "min": ratio = limit / min(h, w) if min(h, w) < limit else 1   # enlarge only
    h' = max(32, round(int(h * ratio) / 32) * 32)       # Python round(): halves go to the even multiple
    w' = max(32, round(int(w * ratio) / 32) * 32)
    if h' * w' > max_resized_pixels:                    # FastPath's cap, both policies: clamp, never an error
        ratio = min(ratio, sqrt(cap / (h * w)), cap / 32 / max(h, w))
        h' = max(32, floor(int(h * ratio) / 32) * 32)   # rounded down, so h' * w' <= cap
        w' = max(32, floor(int(w * ratio) / 32) * 32)

Why each rule, and examples of both policies and the clamp: docs/design/text_detection.md#pipeline.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from fastpath.models.text_detection.config import DEFAULT_MAX_RESIZED_PIXELS, LIMIT_TYPES, NETWORK_STRIDE_PX

# float32 value of each uint8 level after (v * (1/255) - 0.5) / 0.5, with rapidocr's precision:
# the scaling in float32, mean and std in float64, the result cast to float32 (bit-identical to DetPreProcess)
NORMALIZE_LUT = (((np.arange(256, dtype=np.float32) * np.float32(1.0 / 255.0)).astype(np.float64) - 0.5) / 0.5).astype(np.float32)


def resized_shape(height: int, width: int, limit_side_len_px: int, limit_type: str = "max",
                  max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS) -> tuple[int, int]:
    """Network input (height, width) for an image of ``height`` x ``width`` pixels (module docstring).

    Args:
        height, width: source size in pixels, >= 1.
        limit_side_len_px: ``max``: the longer side is scaled down to at most this; ``min``: the
            shorter side is scaled up to at least this (PaddleOCR ``DetResizeForTest``).
        limit_type: ``max`` or ``min`` (``LIMIT_TYPES``).
        max_resized_pixels: cap on the result's height * width, >= 32 * 32; a larger result is
            clamped by scaling down and rounding each side down to a multiple of 32.

    Returns:
        (height, width), each a multiple of 32 and at least 32, with height * width <= ``max_resized_pixels``;
        under ``max`` each side is also <= ``limit_side_len_px`` when that is a multiple of 32.

    Raises:
        ValueError: ``limit_type`` is not one of ``LIMIT_TYPES``.
    """
    if limit_type == "max":
        longest = max(height, width)
        ratio = float(limit_side_len_px) / longest if longest > limit_side_len_px else 1.0
    elif limit_type == "min":
        shortest = min(height, width)
        ratio = float(limit_side_len_px) / shortest if shortest < limit_side_len_px else 1.0
    else:
        raise ValueError(f"limit_type {limit_type!r}: expected one of {', '.join(LIMIT_TYPES)}")
    shape = _sides(height, width, ratio, round)
    if shape[0] * shape[1] <= max_resized_pixels:
        return shape
    ratio = min(ratio, math.sqrt(max_resized_pixels / (height * width)),
                max_resized_pixels / NETWORK_STRIDE_PX / max(height, width))
    return _sides(height, width, ratio, math.floor)


def _sides(height: int, width: int, ratio: float, to_int) -> tuple[int, int]:
    return tuple(  # type: ignore[return-value]
        max(NETWORK_STRIDE_PX, int(to_int(int(side * ratio) / NETWORK_STRIDE_PX) * NETWORK_STRIDE_PX))
        for side in (height, width)
    )


def resize_image(image: np.ndarray, shape_hw: tuple[int, int]) -> np.ndarray:
    """Bilinear resize of uint8 ``[H, W, 3]`` to ``shape_hw``; the image itself when already that size."""
    if image.shape[:2] == tuple(shape_hw):
        return image
    return cv2.resize(image, (shape_hw[1], shape_hw[0]), interpolation=cv2.INTER_LINEAR)


def normalize_into(resized_rgb: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write the normalized BGR planes of a resized RGB image into ``out``.

    Args:
        resized_rgb: uint8 [H, W, 3], RGB.
        out: float32 [3, H, W], e.g. one row of a batch buffer; planes are B, G, R.

    Returns:
        ``out``.
    """
    for plane in range(3):
        np.take(NORMALIZE_LUT, resized_rgb[:, :, 2 - plane], out=out[plane])
    return out
