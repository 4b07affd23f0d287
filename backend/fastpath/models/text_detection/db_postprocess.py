"""DB (Differentiable Binarization) post-processing: probability map -> text quadrilaterals.

Follows rapidocr-onnxruntime 1.4.4 (``ch_ppocr_det/utils.py`` ``DBPostProcess`` with
``score_mode="fast"``, and ``TextDetector.filter_tag_det_res``), itself PaddleOCR's
``ppocr/postprocess/db_postprocess.py`` (Liao et al., "Real-time Scene Text Detection with
Differentiable Binarization", AAAI 2020):

1. binarize ``prob > binary_threshold``; optionally dilate with a 2x2 kernel;
2. contours of the binary map (OpenCV ``findContours``, ``RETR_LIST``, ``CHAIN_APPROX_SIMPLE``);
3. per contour: minimum-area rectangle; drop when its short side < 3 px; score = mean probability
   inside the rectangle; drop when score < ``box_threshold``;
4. unclip: grow the rectangle by ``area * unclip_ratio / perimeter`` (pyclipper, round joins) and
   take the expanded polygon's minimum-area rectangle; drop when its short side < 5 px;
5. scale each axis from the map to the input image, round, clip to the image, order the corners
   clockwise from top-left, drop boxes whose width or height is at most ``min_box_side_px``.

Corners are integers (as rapidocr's) returned as float32, in reading order (:func:`reading_order`).
"""

from __future__ import annotations

import cv2
import numpy as np
import pyclipper

from fastpath.models.text_detection.config import TextDetectionConfig

MIN_RECT_SIDE_PX = 3  # DBPostProcess.min_size (map pixels)
# input-image pixels: top-left corners closer than this vertically are one line of text whatever the boxes'
# heights (PaddleOCR's tools/infer/predict_system.py sorted_boxes, and rapidocr's, use 10 alone)
LINE_TOLERANCE_PX = 10
DILATION_KERNEL = np.ones((2, 2), dtype=np.uint8)


def mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """Minimum-area rectangle of ``contour`` as float32 [4, 2] corners, and its short side.

    Corner order is rapidocr's ``get_mini_boxes``: left pair by y, then right pair by y reversed.
    """
    rect = cv2.minAreaRect(contour)
    points = sorted(list(cv2.boxPoints(rect)), key=lambda point: point[0])
    first, fourth = (0, 1) if points[1][1] > points[0][1] else (1, 0)
    second, third = (2, 3) if points[3][1] > points[2][1] else (3, 2)
    box = np.array([points[first], points[second], points[third], points[fourth]], dtype=np.float32)
    return box, float(min(rect[1]))


def box_score_fast(prob_map: np.ndarray, box: np.ndarray) -> float:
    """Mean of ``prob_map`` [H, W] inside the polygon ``box`` [4, 2] (rapidocr ``box_score_fast``)."""
    height, width = prob_map.shape
    xmin = int(np.clip(np.floor(box[:, 0].min()), 0, width - 1))
    xmax = int(np.clip(np.ceil(box[:, 0].max()), 0, width - 1))
    ymin = int(np.clip(np.floor(box[:, 1].min()), 0, height - 1))
    ymax = int(np.clip(np.ceil(box[:, 1].max()), 0, height - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    shifted = box - np.array([xmin, ymin], dtype=box.dtype)
    cv2.fillPoly(mask, shifted.reshape(1, -1, 2).astype(np.int32), 1)
    return float(cv2.mean(prob_map[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def unclip(box: np.ndarray, unclip_ratio: float) -> np.ndarray:
    """Grow polygon ``box`` [4, 2] by ``area * unclip_ratio / perimeter``; returns points [M, 1, 2] (M may be 0)."""
    corners = box.astype(np.float64)
    x, y = corners[:, 0], corners[:, 1]
    area = 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))
    perimeter = float(np.linalg.norm(corners - np.roll(corners, -1, axis=0), axis=1).sum())
    if perimeter == 0.0:
        return np.zeros((0, 1, 2), dtype=np.float32)
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    paths = offset.Execute(area * unclip_ratio / perimeter)
    if not paths:
        return np.zeros((0, 1, 2), dtype=np.float32)
    return np.concatenate([np.asarray(path, dtype=np.float32) for path in paths]).reshape(-1, 1, 2)


def order_clockwise(points: np.ndarray) -> np.ndarray:
    """Corners [4, 2] as top-left, top-right, bottom-right, bottom-left (rapidocr ``order_points_clockwise``)."""
    by_x = points[np.argsort(points[:, 0]), :]
    left, right = by_x[:2, :], by_x[2:, :]
    top_left, bottom_left = left[np.argsort(left[:, 1]), :]
    top_right, bottom_right = right[np.argsort(right[:, 1]), :]
    return np.array([top_left, top_right, bottom_right, bottom_left], dtype=np.float32)


def _to_image(box: np.ndarray, map_hw: tuple[int, int], image_hw: tuple[int, int]) -> np.ndarray:
    """Scale map coordinates to image pixels, round, clip to [0, W-1] x [0, H-1]; order the corners."""
    (map_h, map_w), (image_h, image_w) = map_hw, image_hw
    scaled = np.empty_like(box)
    scaled[:, 0] = np.clip(np.round(box[:, 0] / map_w * image_w), 0, image_w)
    scaled[:, 1] = np.clip(np.round(box[:, 1] / map_h * image_h), 0, image_h)
    ordered = order_clockwise(scaled.astype(np.int32).astype(np.float32))
    ordered[:, 0] = np.clip(ordered[:, 0], 0, image_w - 1)
    ordered[:, 1] = np.clip(ordered[:, 1], 0, image_h - 1)
    return ordered


def _candidate(prob_map: np.ndarray, contour: np.ndarray, params: TextDetectionConfig) -> tuple[np.ndarray, float] | None:
    """Steps 3-4 for one contour: the expanded rectangle in map coordinates and its score, or None."""
    box, short_side = mini_box(contour)
    if short_side < MIN_RECT_SIDE_PX:
        return None
    score = box_score_fast(prob_map, box)
    if score < params.box_threshold:
        return None
    expanded = unclip(box, params.unclip_ratio)
    if len(expanded) == 0:
        return None
    box, short_side = mini_box(expanded)
    if short_side < MIN_RECT_SIDE_PX + 2:
        return None
    return box, score


def boxes_from_probability_map(prob_map: np.ndarray, image_hw: tuple[int, int], params: TextDetectionConfig) -> tuple[np.ndarray, np.ndarray]:
    """Text boxes of one image from the detector's probability map.

    Args:
        prob_map: float32 [h, w], the detector output for the resized image (values in [0, 1]).
        image_hw: (height, width) of the input image in pixels; boxes are mapped back to it.
        params: the model config (binary_threshold, box_threshold, unclip_ratio, max_candidates,
            use_dilation, min_box_side_px).

    Returns:
        boxes: float32 [K, 4, 2], (x, y) corners clockwise from top-left, integers within
            [0, width-1] x [0, height-1]. K may be 0.
        scores: float32 [K], mean probability inside each box before unclipping, >= box_threshold.
    """
    bitmap = (prob_map > params.binary_threshold).astype(np.uint8)
    if params.use_dilation:
        bitmap = cv2.dilate(bitmap, DILATION_KERNEL)
    contours, _ = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes, scores = [], []
    for contour in contours[: params.max_candidates]:
        found = _candidate(prob_map, contour, params)
        if found is None:
            continue
        box = _to_image(found[0], prob_map.shape, image_hw)
        width = int(np.linalg.norm(box[0] - box[1]))
        height = int(np.linalg.norm(box[0] - box[3]))
        if width <= params.min_box_side_px or height <= params.min_box_side_px:
            continue
        boxes.append(box)
        scores.append(found[1])
    if not boxes:
        return np.zeros((0, 4, 2), dtype=np.float32), np.zeros((0,), dtype=np.float32)
    stacked = np.stack(boxes).astype(np.float32)
    order = reading_order(stacked[:, 0, :], np.linalg.norm(stacked[:, 3, :] - stacked[:, 0, :], axis=1))
    return np.ascontiguousarray(stacked[order]), np.asarray(scores, dtype=np.float32)[order]


def reading_order(top_left: np.ndarray, heights: np.ndarray) -> np.ndarray:
    """Indices that put boxes in reading order: lines top to bottom, each line's boxes left to right (ties by y).

    Args:
        top_left: float [K, 2], each box's top-left corner (x, y) in pixels.
        heights: float [K], each box's height in pixels (top-left to bottom-left corner).

    Taken by y, a box continues the line of the box before it when its top is less than half the smaller of the
    two heights lower, or less than ``LINE_TOLERANCE_PX`` (the rule of PaddleOCR's ``sorted_boxes``, which
    alone splits large text: a word without ascenders starts lower), else it starts the next line. Returns
    int64 [K]; O(K log K).
    """
    by_y = np.lexsort((top_left[:, 0], top_left[:, 1]))
    ys, hs = top_left[by_y, 1], heights[by_y]
    tolerance = np.maximum(LINE_TOLERANCE_PX, 0.5 * np.minimum(hs[1:], hs[:-1]))
    line = np.cumsum(np.concatenate([[True], np.diff(ys) >= tolerance])) if len(ys) else ys
    return by_y[np.lexsort((top_left[by_y, 0], line))].astype(np.int64)
