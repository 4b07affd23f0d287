"""The real text_detection model under a tight staging pool, through a real tritonserver.

A copy of the shipped model whose ``staging_capacity_bytes`` holds one batch block at a time serves many
concurrent requests: leases wait for a block instead of failing, every answer equals the same image sent
alone, and every byte is returned. A pool whose largest block cannot hold the largest batch refuses to
load, naming the bytes needed and the block size.
"""

from __future__ import annotations

import concurrent.futures
import re

import cv2
import numpy as np
import pytest

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from tests.conftest import MODEL_REPOSITORY, load_refusal, start_server, variant_repository, wait_for
from tests.e2e.test_scheduler import _metric_sum, _metrics
from tests.e2e.test_text_detection import MODEL, detect_array
from tests.unit.models.text_detection.reference import skimage_rgb

pytestmark = pytest.mark.e2e
MIB = 1 << 20
FLOAT32_BYTES = 4
CHANNELS = 3  # the engine's input is float32 [batch, 3, h, w]


@pytest.fixture(scope="module", autouse=True)
def _artifacts():
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)  # what `fastpath build --if-missing` does


def _shipped_parameter(key: str) -> int:
    """An integer ``parameters`` value of the shipped text_detection config.pbtxt."""
    config = (MODEL_REPOSITORY / MODEL / "config.pbtxt").read_text()
    (value,) = re.findall(rf'parameters \{{ key: "{key}" value: \{{ string_value: "(\d+)" \}} \}}', config)
    return int(value)


def _photos_1280() -> list[np.ndarray]:
    """Four uint8 RGB photos of scikit-image's wheel resized to 1280x1280 (the engine gets them at that size: min/736 only enlarges)."""
    names = ("page.png", "text.png", "coffee.png", "astronaut.png")
    return [np.ascontiguousarray(cv2.resize(skimage_rgb(name), (1280, 1280), interpolation=cv2.INTER_LINEAR)) for name in names]


def _pool(server) -> dict[str, float]:
    """The staging pool's fastpath_pool_* series on the metrics port, once FastPath has published them."""
    text, labels = _metrics(server), {"model": MODEL, "pool": "staging"}
    names = set(re.findall(r"^(fastpath_pool_\w+)\{[^}]*pool=\"staging\"", text, flags=re.M))
    return {name: _metric_sum(text, name, **labels) for name in names}


def test_32_concurrent_1280px_requests_through_a_32_mib_pool_all_equal_each_alone(tmp_path):
    """A 32 MiB staging pool and batches of one image (batch_buckets 1, max_batch_images 1): a 1280x1280 image
    keeps its size under min/736, so each batch leases 3 x 1280 x 1280 float32 (19.7 MB, a 32 MiB block, the
    whole pool) and batch N+1, staged while N runs, waits for N's block. With the wait bounded by
    staging_wait_timeout_s 30 (longer than any batch runs here; the shipped 1 s is shorter than a 1280x1280 batch
    can take on a loaded 2-core machine, which then answers that batch's request 503), 32 concurrent one-image
    requests of 1280x1280 photos over HTTP all get 200 with BOXES, SCORES and BOX_COUNTS exactly equal to the
    same image sent alone before the load; leases waited (fastpath_pool_waits_total rose),
    no lease gives up (fastpath_pool_exhausted_total 0), and fastpath_pool_bytes_in_use is 0 afterwards."""
    repository = variant_repository(tmp_path, MODEL, staging_capacity_bytes=str(32 * MIB), max_batch_images="1",
                                    batch_buckets="1", staging_wait_timeout_s="30")
    server = start_server(tmp_path, models=(MODEL,), repository=repository)
    try:
        photos = _photos_1280()
        alone = [detect_array(server, "http", image[None]) for image in photos]
        assert sum(len(boxes) for boxes, _, _ in alone) > 0
        before = _pool(server)
        assert before["fastpath_pool_capacity_bytes"] == 32 * MIB
        jobs = [index % len(photos) for index in range(32)]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(lambda index: detect_array(server, "http", photos[index][None]), jobs))
        for index, answer in zip(jobs, answers):
            for got, expected in zip(answer, alone[index]):
                np.testing.assert_array_equal(got, expected)

        assert wait_for(lambda: _pool(server)["fastpath_pool_bytes_in_use"] == 0, timeout_s=30)
        after = _pool(server)
        assert after["fastpath_pool_leases_total"] - before["fastpath_pool_leases_total"] == len(jobs)
        assert after["fastpath_pool_waits_total"] > before["fastpath_pool_waits_total"]  # 7-14 of the 32 leases waited here
        assert after["fastpath_pool_exhausted_total"] == 0
        assert after["fastpath_pool_outstanding_leases"] == 0 and after["fastpath_pool_high_water_bytes"] <= 32 * MIB
        assert server.is_ready()
        # the load warned that one block of the largest batch leaves no room to stage the next beside it
        assert f"holds one {32 * MIB}-byte block of the largest batch" in (tmp_path / "tritonserver.log").read_text()
    finally:
        server.stop()


def test_a_16_mib_pool_with_the_default_batch_refuses_to_load_naming_bytes_and_block(tmp_path):
    """staging_capacity_bytes 16 MiB (largest block 16777216 bytes) with the shipped batches (max_batch_images of
    max_resized_pixels each: 8 x 3 x 2097152 x 4 = 201326592 bytes of float32 input) cannot stage its largest
    batch: loading it fails with a ConfigError naming both numbers, and the model is not ready."""
    needed = _shipped_parameter("max_batch_images") * CHANNELS * _shipped_parameter("max_resized_pixels") * FLOAT32_BYTES
    block = 16 * MIB  # the largest power of two within the capacity
    repository = variant_repository(tmp_path, MODEL, staging_capacity_bytes=str(16 * MIB))
    message = load_refusal(tmp_path, repository, MODEL)
    assert "ConfigError" in message, message
    assert f"needs {needed} bytes of float32 input, above the pool's largest block ({block} bytes)" in message, message
