"""text_detection with decode threads: a request its client cancels while it waits for a decode thread is answered
CANCELLED without being decoded, on a real tritonserver (gRPC cancellation, Triton 2.51).

The queue is told to ask no request whether it was cancelled before it waited 60 s (``cancel_check_after_us``), so
the only place a cancelled request can be dropped is before its decode: ``fastpath_rejected_texts_total``
{reason="cancelled"} (images, for this model) counts exactly those.
"""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from tests.conftest import MODEL_REPOSITORY, start_server, variant_repository
from tests.e2e.callbacks import Callbacks
from tests.e2e.test_scheduler import _metric_sum, _metrics
from tests.e2e.test_text_detection import MODEL, detect_array

pytestmark = pytest.mark.e2e
REQUESTS, KEPT = 24, 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One decode thread, so a burst of requests waits for it; the queue never asks about cancellation."""
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    root = tmp_path_factory.mktemp("triton_detection_cancel")
    repository = variant_repository(root, MODEL, decode_threads="1", opencv_threads="1", limit_type="max",
                                    limit_side_len_px="384", cancel_check_after_us="60000000")
    server = start_server(root, models=(MODEL,), repository=repository)
    try:
        yield server
    finally:
        server.stop()


def _noise_png(seed: int) -> bytes:
    """A 1600x1600 PNG of noise: tens of milliseconds to decode, so 24 of them keep one decode thread busy for a second."""
    image = np.random.default_rng(seed).integers(0, 256, (1600, 1600, 3), dtype=np.uint8)
    ok, data = cv2.imencode(".png", image)
    assert ok
    return data.tobytes()


def test_requests_cancelled_while_waiting_for_the_decode_thread_are_not_decoded(server):
    """Invariant: of a burst of 24 one-image requests behind one decode thread, those cancelled 0.2 s after sending
    that had not reached the thread are answered CANCELLED before decoding (counted as cancelled images, at least
    one); every call gets exactly one callback (the kept ones their boxes); the model serves on."""
    files = [_noise_png(seed) for seed in range(REQUESTS)]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = _metric_sum(_metrics(server), "fastpath_rejected_texts_total", reason="cancelled")
    callbacks = Callbacks()
    results = callbacks.results

    def inputs(data):
        tensor = grpcclient.InferInput("IMAGE_BYTES", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([data], dtype=np.object_))
        return [tensor]

    calls = [client.async_infer(MODEL, inputs(data), callbacks.for_call(i)) for i, data in enumerate(files)]
    time.sleep(0.2)
    for call in calls[KEPT:]:
        call.cancel()
    assert callbacks.wait(REQUESTS, timeout_s=180), f"{len(results)} of {REQUESTS} answered"
    time.sleep(0.5)  # a second callback for any call would have arrived by now
    assert all(len(answers) == 1 for answers in results.values())
    for index in range(REQUESTS):
        (result, error), = results[index]
        if error is None:
            assert result.as_numpy("BOX_COUNTS").shape == (1,)
        else:
            assert index >= KEPT and "CANCELLED" in str(error.status()), (index, error)
    cancelled = _metric_sum(_metrics(server), "fastpath_rejected_texts_total", reason="cancelled") - before
    assert 1 <= cancelled <= REQUESTS - KEPT, cancelled
    client.close()
    assert detect_array(server, "http", np.zeros((1, 64, 64, 3), np.uint8))[2].tolist() == [0]
