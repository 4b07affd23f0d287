"""detect_text planning over a model config: which tensors, which request shapes, result checks."""

from __future__ import annotations

import numpy as np
import pytest

from fastpath_client import InvalidInputError, ServerError
from fastpath_client.detection import check_image_list, detection_io, image_request, parse_detection
from fastpath_client.tensors import model_spec


def _spec(max_batch_size, image_dims, encoded=False):
    inputs = [{"name": "IMAGE", "data_type": "TYPE_UINT8", "dims": image_dims, "optional": encoded}]
    if encoded:
        inputs.append({"name": "IMAGE_BYTES", "data_type": "TYPE_STRING", "dims": [1], "optional": True})
    return model_spec({"name": "text_detection", "max_batch_size": max_batch_size, "input": inputs, "output": [
        {"name": "BOXES", "data_type": "TYPE_FP32", "dims": [-1, 4, 2]},
        {"name": "SCORES", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "COUNT", "data_type": "TYPE_INT32", "dims": [1]},
    ]})


@pytest.mark.parametrize(("max_batch_size", "dims", "shape"), [(8, [-1, -1, 3], (1, 31, 50, 3)),
                                                               (0, [-1, -1, 3], (31, 50, 3)),
                                                               (0, [-1, -1, -1, 3], (1, 31, 50, 3))])
def test_pixel_requests_follow_the_config(max_batch_size, dims, shape):
    spec = _spec(max_batch_size, dims)
    io = detection_io(spec)
    assert (io.pixels.name, io.boxes, io.scores) == ("IMAGE", "BOXES", "SCORES")
    image = np.arange(31 * 50 * 3, dtype=np.uint8).reshape(31, 50, 3)
    request = image_request(io, spec, image, 0)
    assert request["IMAGE"].shape == shape and np.array_equal(request["IMAGE"].reshape(31, 50, 3), image)


def test_encoded_bytes_go_to_the_bytes_input():
    spec = _spec(8, [-1, -1, 3], encoded=True)
    request = image_request(detection_io(spec), spec, b"\x89PNG...", 0)
    assert request["IMAGE_BYTES"].shape == (1, 1) and request["IMAGE_BYTES"][0, 0] == b"\x89PNG..."


@pytest.mark.parametrize(("image", "message"), [
    (b"\x89PNG", r"image 2: .* takes raw UINT8 pixels .*decode first"),
    (np.zeros((4, 4, 3), np.float32), r"image 2: dtype float32, expected uint8"),
    (np.zeros((4, 4, 4), np.uint8), r"image 2: shape \[4, 4, 4\] does not fit input IMAGE dims \[-1, -1, -1, 3\]"),
    (np.zeros(5, np.uint8), r"image 2: shape \[5\] has 1 dimensions; expected HxWx3 RGB"),
    (np.zeros((2, 4, 4, 3), np.uint8), r"image 2: shape \[2, 4, 4, 3\] has 4 dimensions; .*one image per list item"),
    ("page.png", r"image 2 is a file name \('page.png'\), not an image: pass its bytes"),
    (None, r"image 2 is None, not an image: pass an HxWx3 uint8 array or the bytes of a PNG/JPEG file"),
    (7, r"image 2 is 7, not an image"),
])
def test_bad_images_are_refused_before_sending(image, message):
    spec = _spec(8, [-1, -1, 3])
    with pytest.raises(InvalidInputError, match=message):
        image_request(detection_io(spec), spec, image, 2)


@pytest.mark.parametrize("shape", [(10, 10, 5), (10, 10, 0), (0, 5, 3), (5, 0, 3), (0, 0)])
def test_a_shape_no_detector_takes_is_refused_with_its_index(shape):
    """With text_detection's open dims ([N, H, W, C] all -1) the config admits any shape, so the client itself
    refuses what the model never takes (H or W of 0, C outside 1..4), naming the image's index, before a request
    for any image of the call is sent."""
    spec = _spec(0, [-1, -1, -1, -1], encoded=True)
    with pytest.raises(InvalidInputError, match=r"image 3: shape .*expected HxWxC with H, W >= 1 and C = 1 \(gray\), "
                                                r"2 \(gray \+ alpha\), 3 \(RGB\) or 4 \(RGBA\)"):
        image_request(detection_io(spec), spec, np.zeros(shape, np.uint8), 3)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_every_channel_count_the_detector_takes_is_sent(channels):
    """C = 1 (gray), 2 (gray + alpha), 3 (RGB) and 4 (RGBA) go out as one [1, H, W, C] IMAGE request."""
    spec = _spec(0, [-1, -1, -1, -1], encoded=True)
    request = image_request(detection_io(spec), spec, np.zeros((6, 7, channels), np.uint8), 0)
    assert request["IMAGE"].shape == (1, 6, 7, channels)


@pytest.mark.parametrize(("images", "message"), [
    (np.zeros((720, 1280, 3), np.uint8), r"one array of shape \[720, 1280, 3\] .*detect_text\(\[image\]\)"),
    (np.zeros((720, 1280), np.uint8), r"one array of shape \[720, 1280\]"),
    (b"\xff\xd8\xff", r"got a single bytes; wrap it in a list"),
    ("page.png", r"got a single str; wrap it in a list"),
])
def test_one_image_outside_a_sequence_is_refused(images, message):
    """Iterating one HxWx3 array yields H rows (H grayscale "images") and bytes yield ints: detect_text(image)
    must fail before sending anything, not send H requests."""
    with pytest.raises(InvalidInputError, match=message):
        check_image_list(images)


def test_sequences_of_images_pass_the_list_check():
    """A list of arrays or files, and an NxHxWx3 array (N images), are sequences of images."""
    for images in ([np.zeros((4, 4, 3), np.uint8)], [b"\x89PNG"], np.zeros((2, 4, 4, 3), np.uint8), ()):
        check_image_list(images)


def test_a_model_without_boxes_is_not_a_detector():
    spec = model_spec({"name": "m", "input": [{"name": "X", "data_type": "TYPE_UINT8", "dims": [3]}],
                       "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]})
    with pytest.raises(InvalidInputError, match="does not look like a text detector"):
        detection_io(spec)


def test_parse_detection_shapes_and_mismatch():
    io = detection_io(_spec(8, [-1, -1, 3]))
    found = parse_detection(io, "m", {"BOXES": np.ones((1, 2, 4, 2)), "SCORES": np.array([[0.9, 0.8]])})
    assert found.boxes.shape == (2, 4, 2) and found.boxes.dtype == np.float32 and found.scores.shape == (2,)
    empty = parse_detection(io, "m", {"BOXES": np.zeros((0, 4, 2), np.float32), "SCORES": np.zeros(0, np.float32)})
    assert empty.boxes.shape == (0, 4, 2)
    with pytest.raises(ServerError, match="2 boxes but 1 scores"):
        parse_detection(io, "m", {"BOXES": np.ones((2, 4, 2)), "SCORES": np.array([0.5])})
