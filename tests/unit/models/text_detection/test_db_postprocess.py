"""DB post-processing: synthetic maps with known answers, and real maps against rapidocr's DBPostProcess."""

import numpy as np
import pytest

from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.db_postprocess import boxes_from_probability_map, order_clockwise, reading_order
from fastpath.models.text_detection.preprocess import normalize_into, resize_image, resized_shape
from tests.unit.models.text_detection.reference import rapidocr_detector, skimage_rgb

PARAMS = TextDetectionConfig()


def _map_with(rectangles, shape=(128, 256), value=0.9):
    prob = np.zeros(shape, np.float32)
    for top, left, bottom, right in rectangles:
        prob[top:bottom, left:right] = value
    return prob


def test_no_text_gives_typed_empty_outputs():
    boxes, scores = boxes_from_probability_map(np.zeros((64, 64), np.float32), (64, 64), PARAMS)
    assert boxes.shape == (0, 4, 2) and boxes.dtype == np.float32
    assert scores.shape == (0,) and scores.dtype == np.float32


def test_below_box_threshold_is_dropped():
    boxes, _ = boxes_from_probability_map(_map_with([(40, 100, 60, 200)], value=0.4), (128, 256), PARAMS)
    assert len(boxes) == 0


def test_one_rectangle_maps_back_to_image_pixels():
    boxes, scores = boxes_from_probability_map(_map_with([(40, 100, 60, 200)]), (256, 512), PARAMS)
    assert boxes.shape == (1, 4, 2)
    box = boxes[0]
    (x0, y0), (x1, _), (x2, y2), (_, y3) = box
    assert x0 < 200 and x1 > 400 and y0 < 80 and y2 > 120  # the 2x-scaled rectangle [200, 400) x [80, 120), grown
    assert x0 > 150 and x1 < 450 and y0 > 40 and y2 < 160  # ... by the unclip distance, not more
    assert y0 <= y3 and x0 <= x2  # clockwise from top-left
    assert np.array_equal(box, np.round(box))
    assert 0.8 < scores[0] < 0.9  # the mean over the rectangle of the dilated region, which has a zero border


def test_boxes_are_clipped_to_the_image_and_sorted_top_to_bottom():
    prob = _map_with([(100, 0, 128, 256), (10, 150, 30, 250), (10, 10, 30, 100)])
    boxes, scores = boxes_from_probability_map(prob, (128, 256), PARAMS)
    assert len(boxes) == 3 and len(scores) == 3
    assert boxes[..., 0].min() >= 0 and boxes[..., 0].max() <= 255
    assert boxes[..., 1].min() >= 0 and boxes[..., 1].max() <= 127
    tops = [(box[0, 1], box[0, 0]) for box in boxes]
    assert tops == sorted(tops)


def test_words_of_one_line_read_left_to_right():
    """Boxes of one line whose top-left corners differ by a pixel or two (a word every 2000 px of a long strip)
    come left to right, not ordered by that pixel."""
    top_left = np.array([[8100, 11], [99, 10], [2099, 11], [4100, 10], [6100, 12]], np.float32)
    order = reading_order(top_left, np.full(5, 8.0, np.float32))
    assert top_left[order, 0].tolist() == [99, 2099, 4100, 6100, 8100]


def test_lines_read_top_to_bottom_each_left_to_right():
    """Two lines 40 px apart: every box of the upper line comes before every box of the lower one, whatever the
    x; within each line, left to right. Small boxes (8 px) whose tops are 10 px apart are two lines."""
    top_left = np.array([[300, 52], [10, 50], [500, 90], [20, 93]], np.float32)
    assert reading_order(top_left, np.full(4, 20.0, np.float32)).tolist() == [1, 0, 3, 2]
    assert reading_order(np.array([[50, 60], [5, 70]], np.float32), np.full(2, 8.0, np.float32)).tolist() == [0, 1]
    assert reading_order(np.zeros((0, 2), np.float32), np.zeros(0, np.float32)).tolist() == []


def test_large_text_keeps_its_line_when_tops_differ_by_more_than_10_px():
    """Words of one line of 96 px text start up to ~15 px apart (a word without ascenders starts lower): a box
    less than half the smaller height below the one before continues the line, so the line reads left to right;
    the next line, a full height lower, stays the next line."""
    top_left = np.array([[314, 40], [44, 55], [588, 42], [934, 40], [40, 160], [400, 172]], np.float32)
    heights = np.array([80, 66, 80, 80, 80, 66], np.float32)
    assert reading_order(top_left, heights).tolist() == [1, 0, 2, 3, 4, 5]


def test_a_slanted_line_stays_one_line():
    """Words of a line rising to the right (each top 8 px above its left neighbour's) read left to right: a line
    continues while each box is close enough to the one before, however far its ends drift apart."""
    top_left = np.array([[100, 0], [50, 8], [0, 16], [40, 60]], np.float32)
    assert reading_order(top_left, np.full(4, 12.0, np.float32)).tolist() == [2, 1, 0, 3]


def test_served_boxes_of_a_line_with_uneven_tops_read_left_to_right():
    """Through the whole post-processing: a word on the left whose box starts 3 map pixels lower than the word
    on its right still comes first."""
    prob = _map_with([(13, 10, 30, 100), (10, 150, 30, 250)])
    boxes, _ = boxes_from_probability_map(prob, (128, 256), PARAMS)
    assert len(boxes) == 2 and boxes[0, 0, 1] > boxes[1, 0, 1] and boxes[0, 0, 0] < boxes[1, 0, 0]


def test_max_candidates_limits_the_contours_examined():
    prob = _map_with([(10, 10, 30, 100), (60, 10, 80, 100)])
    boxes, _ = boxes_from_probability_map(prob, (128, 256), TextDetectionConfig(max_candidates=1))
    assert len(boxes) == 1


def test_order_clockwise():
    points = np.array([[10, 20], [0, 0], [10, 0], [0, 20]], np.float32)
    np.testing.assert_array_equal(order_clockwise(points), [[0, 0], [10, 0], [10, 20], [0, 20]])


@pytest.mark.parametrize(("name", "scale"), [("page.png", 1.0), ("page.png", 3.0), ("coffee.png", 1.0), ("text.png", 2.0)])
def test_real_maps_equal_rapidocr_dbpostprocess(name, scale):
    """Same probability map in, the very same boxes and scores out as rapidocr's DBPostProcess + filter."""
    detector = rapidocr_detector()
    rgb = skimage_rgb(name, scale)
    shape = resized_shape(*rgb.shape[:2], 960)
    feed = np.empty((1, 3) + shape, np.float32)
    normalize_into(resize_image(rgb, shape), feed[0])
    prob = detector.infer(feed)[0]  # [1, 1, h, w]
    ref_boxes, ref_scores = detector.postprocess_op(prob, rgb.shape[:2])
    ref_boxes = detector.filter_tag_det_res(ref_boxes, rgb.shape[:2])
    boxes, scores = boxes_from_probability_map(prob[0, 0], rgb.shape[:2], PARAMS)
    assert len(boxes) == len(ref_boxes) > 0
    for ref_box in ref_boxes:
        assert sum(np.array_equal(box, ref_box) for box in boxes) == 1
    for score in scores:  # rapidocr's scores are not filtered with its boxes, so compare as a set
        assert np.abs(np.asarray(ref_scores) - score).min() < 1e-6
