"""text_detection under any sequence of image shapes, through a real tritonserver.

FastPath's batch policy for images (``ExactShapePolicy``) keeps one bucket per resized shape and forgets
idle buckets once a new shape would make more than ``max_idle_shapes`` (64), never the bucket of a
shape the arriving request uses. Invariant checked here: whatever the order, mix and concurrency of
image shapes, every request is answered HTTP 200 with one ``BOX_COUNTS`` entry per image (0 for an
image without text), and afterwards the model still serves the same boxes and readiness is 200.

Sizes are legal under the shipped config: every resize stays within ``max_resized_pixels``
(2097152: 736x2784 is 2049024) and every image and request within ``max_image_pixels`` /
``max_request_pixels`` (67108864) and 16 images. The detector runs on the CPU, where a 736x2752
input takes about 2 s on 2 cores; so the load with hundreds of requests runs on a copy of the model
whose resize policy is ``max``/384 (inputs of at most 384x384), which leaves the queue's shape
handling as it is.
"""

from __future__ import annotations

import concurrent.futures
import random

import numpy as np
import pytest

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from fastpath.models.text_detection.preprocess import resized_shape
from fastpath.triton.progress import live_progress
from tests.conftest import MODEL_REPOSITORY, start_server, variant_repository, wait_for
from tests.e2e.test_text_detection import MODEL, detect_bytes
from tests.unit.models.text_detection.reference import jpeg_bytes, png_bytes, skimage_path

pytestmark = pytest.mark.e2e
MAX_IDLE_SHAPES = 64  # ExactShapePolicy's default; config.pbtxt does not set it
FAILURE_SIGNS = ("Traceback", "KeyError", "should return >= 0", "cannot send more than one response", "Stub process")


def _white_png(height: int, width: int) -> bytes:
    return png_bytes(np.full((height, width, 3), 255, np.uint8))


def _flat(height: int, width: int, level: int, form: str) -> bytes:
    """A one-colour RGB image (no text) of the given size, as a PNG or a JPEG file."""
    image = np.full((height, width, 3), level, np.uint8)
    return png_bytes(image) if form == "png" else jpeg_bytes(image, quality=85)


def _in_flight(server) -> int:
    """Requests the model's one instance has accepted and not answered, by its progress record."""
    (record,) = live_progress(server.state_dir, MODEL).values()
    assert record.accepted > 0
    return record.in_flight


def _assert_served_without_failures(server, page_boxes) -> None:
    """Readiness 200, the model answers page.png with the boxes it gave before, its instance counts no request
    unanswered (by its next heartbeat), and the log shows no failure."""
    assert server.is_ready(models=[MODEL])
    boxes, _, counts = detect_bytes(server, "http", [skimage_path("page.png").read_bytes()])
    np.testing.assert_array_equal(boxes, page_boxes)
    assert counts.tolist() == [len(page_boxes)]
    assert wait_for(lambda: _in_flight(server) == 0, timeout_s=30)
    log = server.log_path.read_text()
    assert [sign for sign in FAILURE_SIGNS if sign in log] == []


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    server = start_server(tmp_path_factory.mktemp("triton_detection_shapes"), models=(MODEL,))
    try:
        yield server
    finally:
        server.stop()


def test_64_shapes_then_a_request_reusing_the_first_and_a_new_one_are_all_answered(server):
    """White PNGs 736 px high, 736 + 32k px wide for k = 0..63, one per request (64 resized shapes: the
    bucket table is full); then one request of 736x2784 (a 65th shape, so idle buckets are forgotten)
    and 736x736 (the first shape, whose bucket must be kept); then 736x800. Each is answered 200 with
    no boxes, and the model serves on."""
    page_boxes = detect_bytes(server, "http", [skimage_path("page.png").read_bytes()])[0]
    shapes = {resized_shape(736, 736 + 32 * k, 736, "min") for k in range(64)}
    assert len(shapes) == MAX_IDLE_SHAPES
    for k in range(64):
        _, _, counts = detect_bytes(server, "http", [_white_png(736, 736 + 32 * k)])
        assert counts.tolist() == [0], k
    _, _, counts = detect_bytes(server, "http", [_white_png(736, 2784), _white_png(736, 736)])
    assert counts.tolist() == [0, 0]
    _, _, counts = detect_bytes(server, "http", [_white_png(736, 800)])
    assert counts.tolist() == [0]
    _assert_served_without_failures(server, page_boxes)


def test_three_threads_of_random_jpegs_are_all_answered(server):
    """3 threads each send 8 one-colour JPEGs of random sizes (32..900 px a side) under the shipped
    min/736 policy: every request 200 with no boxes, and the model serves on."""
    page_boxes = detect_bytes(server, "http", [skimage_path("page.png").read_bytes()])[0]
    rng = random.Random(14)
    jobs = [[_flat(rng.randint(32, 900), rng.randint(32, 900), rng.randint(0, 255), "jpeg")] for _ in range(24)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        counts = [result[2].tolist() for result in pool.map(lambda files: detect_bytes(server, "http", files), jobs)]
    assert counts == [[0]] * len(jobs)
    _assert_served_without_failures(server, page_boxes)


@pytest.fixture(scope="module")
def small_inputs_server(tmp_path_factory):
    """text_detection as shipped but resizing under max/384: inputs of at most 384x384, up to 144 shapes."""
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    root = tmp_path_factory.mktemp("triton_detection_small_inputs")
    repository = variant_repository(root, MODEL, limit_type="max", limit_side_len_px="384")
    server = start_server(root, models=(MODEL,), repository=repository)
    try:
        yield server
    finally:
        server.stop()


def test_hundreds_of_random_sizes_from_several_threads_are_all_answered(small_inputs_server):
    """360 requests of 1-3 one-colour images each (PNG and JPEG, sides 1..420 px: well over 64 resized
    shapes, so idle buckets are forgotten again and again while others are queued), from 6 threads:
    every request 200 with one zero per image, and the model serves on."""
    server = small_inputs_server
    page_boxes = detect_bytes(server, "http", [skimage_path("page.png").read_bytes()])[0]
    rng = random.Random(1414)
    jobs = [[(rng.randint(1, 420), rng.randint(1, 420), rng.randint(0, 255), rng.choice(("png", "jpeg")))
             for _ in range(rng.randint(1, 3))] for _ in range(360)]
    shapes = {resized_shape(height, width, 384, "max") for job in jobs for height, width, _, _ in job}
    assert len(shapes) > 2 * MAX_IDLE_SHAPES

    def send(job):
        return detect_bytes(server, "http", [_flat(*image) for image in job])[2].tolist()

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        counts = list(pool.map(send, jobs))
    assert counts == [[0] * len(job) for job in jobs]
    _assert_served_without_failures(server, page_boxes)
