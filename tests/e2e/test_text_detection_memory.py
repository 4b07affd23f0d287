"""text_detection's stub memory after the largest legal request, on a real tritonserver.

The request: 16 RGB images of 1400x1400 in one IMAGE tensor, within every shipped cap (16 images,
31 Mpx of 64, each resized to 1408x1408 under the 2 Mpx clamp, two engine calls of 8). The stub's
resident set is read from /proc (VmRSS, and VmHWM reset just before the request): its peak above the
idle stub (measured after a warm-up request) must be what the documented formula
(fastpath.models.text_detection.budget.predict_peak) predicts, within 20%, and within the bound for
every legal request (peak_budget); once answered, the stub must come back within 1.5x of its idle size
and within steady_budget, and a second such request must not raise either.
"""

from __future__ import annotations

import os
import time

import cv2
import numpy as np
import pytest
import tritonclient.http as httpclient

from fastpath.memory import process_memory, reset_peak_rss
from fastpath.models.text_detection.budget import RequestShape, peak_budget, predict_peak, steady_budget
from fastpath.server.process import GLIBC_TUNABLES, group_members
from fastpath.server.stubs import list_stubs
from tests.conftest import wait_for
from tests.e2e import test_text_detection
from tests.unit.models.text_detection.reference import skimage_rgb
from tests.unit.models.text_detection.test_budget import shipped

pytestmark = pytest.mark.e2e
MODEL = "text_detection"
SIDE_PX = 1400
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "page.png", "text.png", "rocket.jpg", "camera.png", "motorcycle_left.png")
MIB = 1 << 20
server = test_text_detection.server  # a tritonserver serving text_detection alone, for this module


def detect(server, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One HTTP request of uint8 [N, H, W, 3]; returns (BOXES, BOX_COUNTS)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=600, connection_timeout=600)
    tensor = httpclient.InferInput("IMAGE", list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch)
    try:
        result = client.infer(MODEL, [tensor])
        return result.as_numpy("BOXES"), result.as_numpy("BOX_COUNTS")
    finally:
        client.close()


def settled_rss(pid: int, timeout_s: float = 60.0) -> int:
    """The stub's VmRSS once it has stopped changing by more than 1 MiB for a second (the memory returner
    runs after the response of a request's last batch has gone out)."""
    readings: list[int] = []

    def settled() -> bool:
        readings.append(process_memory(pid).rss_bytes)
        recent = readings[-5:]
        return len(recent) == 5 and max(recent) - min(recent) <= MIB

    assert wait_for(settled, timeout_s, poll_s=0.25), f"stub RSS still changing: {[r >> 20 for r in readings[-8:]]} MiB"
    return readings[-1]


def largest_request() -> np.ndarray:
    """16 real photos resized to 1400x1400, RGB: the second eight repeat the first eight."""
    photos = [cv2.resize(skimage_rgb(name), (SIDE_PX, SIDE_PX), interpolation=cv2.INTER_LINEAR) for name in PHOTOS]
    return np.ascontiguousarray(np.stack(photos + photos))


def test_largest_legal_request_peaks_as_predicted_and_the_stub_returns_near_idle(server):
    config, sched = shipped()
    (stub,) = [s for s in list_stubs(group_members(server.pid)) if s.model == MODEL]
    tunables = os.environ.get("GLIBC_TUNABLES", GLIBC_TUNABLES)  # what fastpath serve gives every stub
    with open(f"/proc/{stub.pid}/environ", "rb") as environ:
        assert f"GLIBC_TUNABLES={tunables}".encode() in environ.read().split(b"\0")
    page = skimage_rgb("page.png")[None]
    detect(server, page)  # warm-up request
    idle = settled_rss(stub.pid)
    budget_mib = peak_budget(config, sched.batch_buckets).total_bytes >> 20  # logged at load, for operators
    assert f"text_detection memory budget: at most {budget_mib} MiB" in server.log_path.read_text()
    request = RequestShape(images=16, height=SIDE_PX, width=SIDE_PX)
    predicted = predict_peak(config, sched.batch_buckets, request).total_bytes
    batch = largest_request()

    for attempt in range(2):
        reset_peak_rss(stub.pid)
        start_s = time.monotonic()
        boxes, counts = detect(server, batch)
        seconds = time.monotonic() - start_s
        peak = process_memory(stub.pid).peak_rss_bytes - idle
        steady = settled_rss(stub.pid)
        print(f"request {attempt}: {seconds:.1f} s; idle {idle >> 20} MiB, peak +{peak >> 20} MiB "
              f"(predicted +{predicted >> 20}), steady {steady >> 20} MiB = {steady / idle:.2f}x idle")
        edges = np.concatenate([[0], np.cumsum(counts)])
        per_image = [boxes[a:b] for a, b in zip(edges[:-1], edges[1:])]
        assert counts.shape == (16,) and counts.sum() > 0
        for first, again in zip(per_image[:8], per_image[8:]):  # the same photo twice: the same boxes
            np.testing.assert_array_equal(first, again)
        assert abs(peak - predicted) <= 0.2 * predicted
        assert peak <= peak_budget(config, sched.batch_buckets).total_bytes
        assert steady <= 1.5 * idle
        assert steady - idle <= steady_budget(config, sched.batch_buckets, request)
