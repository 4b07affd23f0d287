"""text_detection on ONNX Runtime's CUDA EP (model.uint8.onnx), against the CPU path. Skips without CUDA.

Invariants:
* boxes on the GPU equal the CPU path's: same count per image, each matched box with IoU >= 0.99
  (float32 on both; TF32 off);
* a shape that recurs gets a CUDA graph and its replays return what the first (eager) run returned,
  for a different image each time (never an earlier request's maps);
* no text gives zero boxes; the staging and map leases all go back to the pool.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastpath.memory import PoolConfig, create_host_pool
from fastpath.models.text_detection.config import UINT8_ARTIFACT, TextDetectionConfig
from fastpath.models.text_detection.device_batches import DeviceBatchHandler
from fastpath.models.text_detection.pipeline import TextDetector
from tests.gpu.torch_support import REPO_ROOT
from tests.unit.models.text_detection.reference import skimage_rgb

VERSION_DIR = REPO_ROOT / "model_repository" / "text_detection" / "1"
CONFIG = TextDetectionConfig(limit_type="min", limit_side_len_px=736, max_resized_pixels=2048 * 1024)


@pytest.fixture(scope="module")
def gpu():
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} here has no CUDAExecutionProvider (install onnxruntime-gpu and use a CUDA machine)")
    if not (VERSION_DIR / UINT8_ARTIFACT).is_file():
        pytest.skip(f"{VERSION_DIR / UINT8_ARTIFACT} is missing: run 'fastpath build'")
    detector = TextDetector.from_directory(VERSION_DIR, CONFIG, device="cuda:0", batch_sizes=(1, 2))
    yield detector
    detector.close()


@pytest.fixture(scope="module")
def cpu():
    detector = TextDetector.from_directory(VERSION_DIR, CONFIG)
    yield detector
    detector.close()


def iou(a: np.ndarray, b: np.ndarray) -> float:
    import cv2

    inter, _ = cv2.intersectConvexConvex(a.astype(np.float32), b.astype(np.float32))
    return inter / (cv2.contourArea(a.astype(np.float32)) + cv2.contourArea(b.astype(np.float32)) - inter)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["text.png", "page.png", "astronaut.png", "rocket.jpg"])
def test_boxes_on_the_gpu_equal_the_cpu_paths(gpu, cpu, name):
    image = skimage_rgb(name)
    (expected,), (got,) = cpu.detect([image]), gpu.detect([image])
    assert len(got.boxes) == len(expected.boxes)
    for box in expected.boxes:
        assert max(iou(box, other) for other in got.boxes) >= 0.99


@pytest.mark.gpu
def test_a_captured_shape_replays_a_graph_with_each_requests_own_maps(gpu):
    pool = create_host_pool(PoolConfig(capacity_bytes=256 << 20, max_block_bytes=128 << 20), name="test", device="cuda:0")
    handler = DeviceBatchHandler(gpu, pool)
    rng = np.random.default_rng(0)
    images = [gpu.prepare(rng.integers(0, 256, (736, 992, 3), dtype=np.uint8)) for _ in range(8)]
    first = {}
    kinds = []
    for round_ in range(2):
        if round_ == 1:
            gpu.engine.capture([(1, 736, 992)])
        for index, image in enumerate(images):
            result = handler.run(handler.stage_images([image], 1, image.shape_hw))
            maps = result.maps[0].copy()
            result.lease.release()
            if round_ == 0:
                first[index] = maps
            else:
                np.testing.assert_allclose(maps, first[index], atol=1e-5)
                if index:
                    assert not np.array_equal(maps, first[index - 1])
        kinds.append(gpu.engine.stats())
    assert (1, 736, 992) in gpu.engine.graph_shapes
    assert kinds[0].graph_runs == 0 and kinds[0].eager_runs >= len(images) and kinds[-1].graph_runs >= len(images)
    assert pool.stats().bytes_in_use == 0
    pool.close()


@pytest.mark.gpu
def test_no_text_gives_zero_boxes_on_the_gpu(gpu):
    (white,) = gpu.detect([np.full((640, 640, 3), 255, np.uint8)])
    assert white.boxes.shape == (0, 4, 2) and white.scores.shape == (0,)
