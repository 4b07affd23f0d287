"""text_detection with decode threads (``decode_threads``, what its GPU configuration uses) and OpenCV on the calling
thread (``opencv_threads`` 1), on a real tritonserver.

With ``decode_threads`` > 0 (its threads taken in either ``thread_pool_order``), ``execute()`` copies each
request's tensor and returns; a decode thread checks,
decodes and resizes the images and queues them, or answers the request's error. Invariants, with requests of
real photos (PNG, JPEG, raw uint8 arrays) and bad ones sent concurrently from several threads:
* every good request gets the boxes the same detector computes in-process (OpenCV's default pool) for its images,
  in order;
* every bad request (corrupt file, zero-sized array) gets its own 400 and the good ones are unaffected;
* every request gets exactly one answer and the model serves on.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.pipeline import TextDetector
from tests.conftest import MODEL_REPOSITORY, start_server, variant_repository
from tests.e2e.test_text_detection import MODEL, detect_array, detect_bytes
from tests.unit.models.text_detection.reference import jpeg_bytes, png_bytes, skimage_rgb

pytestmark = pytest.mark.e2e
RESIZE = {"limit_type": "max", "limit_side_len_px": "384"}  # small inputs: fast on 2 CPU cores


@pytest.fixture(scope="module", params=["fifo", "lifo"])
def server(tmp_path_factory, request):
    """The model with three decode threads, taken longest-idle first (ThreadPoolExecutor) or last-idle first
    (``thread_pool_order`` lifo: fastpath.workers.LifoThreadPool)."""
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    root = tmp_path_factory.mktemp(f"triton_detection_decode_threads_{request.param}")
    repository = variant_repository(root, MODEL, decode_threads="3", opencv_threads="1", thread_pool_order=request.param,
                                    **RESIZE)
    server = start_server(root, models=(MODEL,), repository=repository)
    try:
        yield server
    finally:
        server.stop()


def test_decode_threads_answer_every_request_once_with_the_in_process_boxes(server):
    detector = TextDetector.from_directory(MODEL_REPOSITORY / MODEL / "1", TextDetectionConfig(
        limit_type="max", limit_side_len_px=384, intra_op_threads=1))
    photos = {name: skimage_rgb(name) for name in ("page.png", "text.png", "coffee.png")}
    expected = {name: [len(d.boxes) for d in detector.detect([image])] for name, image in photos.items()}
    detector.close()
    jobs = []
    for k in range(24):
        name = list(photos)[k % 3]
        kind = ("png", "jpeg", "array", "corrupt", "empty")[k % 5]
        jobs.append((name, kind))

    def send(job):
        name, kind = job
        image = photos[name]
        try:
            if kind == "array":
                return detect_array(server, "http", image[None])[2].tolist()
            if kind == "empty":
                return detect_array(server, "http", np.zeros((1, 0, 0, 3), np.uint8))[2].tolist()
            data = png_bytes(image) if kind == "png" else jpeg_bytes(image)
            return detect_bytes(server, "http", [data[: len(data) // 2] if kind == "corrupt" else data])[2].tolist()
        except InferenceServerException as exc:
            return exc.status(), exc.message()

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(send, jobs))
    for (name, kind), result in zip(jobs, results):
        if kind in ("corrupt", "empty"):
            assert result[0] == "400", (name, kind, result)
        elif kind == "jpeg":
            assert isinstance(result, list) and len(result) == 1, (name, kind, result)
        else:  # PNG and raw arrays carry exactly the pixels detected in-process
            assert result == expected[name], (name, kind, result)
    assert httpclient.InferenceServerClient(server.http_url).is_model_ready(MODEL)
