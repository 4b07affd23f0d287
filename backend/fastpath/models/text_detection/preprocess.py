"""Detector input: resize to a multiple of 32, normalize, lay out as BGR planes.

Follows rapidocr-onnxruntime 1.4.4 ``ch_ppocr_det/utils.py`` ``DetPreProcess`` with
``limit_type="max"`` (PaddleOCR's ``det_limit_type`` default), plus a floor of 32 pixels per side
so that tiny images (1x1, 31x31) still give a valid network input instead of rapidocr's "no result":

    ratio = limit / max(h, w) if max(h, w) > limit else 1
    h' = max(32, round(int(h * ratio) / 32) * 32)       # Python round(): halves go to the even multiple
    w' = max(32, round(int(w * ratio) / 32) * 32)
    resized = cv2.resize(image, (w', h'))                # bilinear (INTER_LINEAR), uint8
    x = (pixel / 255 - 0.5) / 0.5                        # mean = std = 0.5 per channel

Examples with limit 960: 1x1 and 31x31 -> 32x32, 33x50 -> 32x64,
641x479 -> 640x480, 100x3000 -> 32x960, 8000x8000 -> 960x960.

PP-OCR models are trained on OpenCV-decoded (BGR) images, so the planes are written in B, G, R order.
"""

from __future__ import annotations

import cv2
import numpy as np

from fastpath.models.text_detection.config import NETWORK_STRIDE_PX

# float32 value of each uint8 level after (v * (1/255) - 0.5) / 0.5, with rapidocr's precision:
# the scaling in float32, mean and std in float64, the result cast to float32 (bit-identical to DetPreProcess)
NORMALIZE_LUT = (((np.arange(256, dtype=np.float32) * np.float32(1.0 / 255.0)).astype(np.float64) - 0.5) / 0.5).astype(np.float32)


def resized_shape(height: int, width: int, limit_side_len_px: int) -> tuple[int, int]:
    """Network input (height, width) for an image of ``height`` x ``width`` pixels.

    Args:
        height, width: source size in pixels, >= 1.
        limit_side_len_px: the longer side is scaled down to at most this (a multiple of 32).

    Returns:
        (height, width), each a multiple of 32, at least 32, at most ``limit_side_len_px``.
    """
    longest = max(height, width)
    ratio = float(limit_side_len_px) / longest if longest > limit_side_len_px else 1.0
    return tuple(  # type: ignore[return-value]
        max(NETWORK_STRIDE_PX, int(round(int(side * ratio) / NETWORK_STRIDE_PX) * NETWORK_STRIDE_PX))
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
