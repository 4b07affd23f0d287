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
from fastpath.models.text_detection.pipeline import PreparedImage, TextDetector
from fastpath.models.text_detection.probe import ProbedRequest
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


@pytest.fixture(scope="module")
def nvjpeg(gpu):
    pytest.importorskip("torchvision", reason="torchvision is not installed (decode_device cuda needs its nvJPEG decoder)")
    from fastpath.models.text_detection.device_decode import DeviceJpegDecoder

    return DeviceJpegDecoder("cuda:0")


def jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    import cv2

    ok, data = cv2.imencode(".jpg", np.ascontiguousarray(image[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return data.tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["text.png", "page.png", "chelsea.png"])
def test_nvjpeg_batches_staged_on_the_device_give_the_maps_of_the_same_pixels_staged_on_the_host(gpu, nvjpeg, name):
    """decode_device cuda: nvJPEG decodes to the header's size within a mean of 2 levels of OpenCV's pixels; a batch
    staged on the device (padding, filler rows, D2D into the graph input) gives the very maps that the same pixels
    staged through the pinned pool give. (Boxes against the CPU decode are a benchmark figure: the decoders differ.)"""
    from fastpath.models.text_detection.device_decode import prepare_on_device
    from fastpath.models.text_detection.image import decode_encoded

    data = jpeg(skimage_rgb(name))
    image = decode_encoded(data, index=0, expected_hw=skimage_rgb(name).shape[:2])
    (decoded,) = nvjpeg.images(ProbedRequest([data], [image.shape[:2]]))
    assert decoded.is_cuda and tuple(decoded.shape) == (3, *image.shape[:2])
    assert float(np.abs(decoded.permute(1, 2, 0).cpu().numpy().astype(int) - image).mean()) < 2.0
    prepared = prepare_on_device(decoded, CONFIG)
    on_host = PreparedImage(prepared.resized.cpu().numpy(), prepared.source_hw)
    pool = create_host_pool(PoolConfig(capacity_bytes=64 << 20, max_block_bytes=32 << 20), name="nvjpeg", device="cuda:0")
    handler = DeviceBatchHandler(gpu, pool)
    maps = {}
    for where, item in (("device", prepared), ("host", on_host)):
        staged = handler.stage_images([item], 2, item.shape_hw)
        assert (staged.lease is None) == (where == "device")
        result = handler.run(staged)
        maps[where] = result.maps[0].copy()
        result.lease.release()
    np.testing.assert_array_equal(maps["device"], maps["host"])
    assert gpu.engine.stats().d2d_bytes > 0 and pool.stats().bytes_in_use == 0
    pool.close()


@pytest.mark.gpu
def test_nvjpeg_leaves_png_to_the_cpu_decoder_and_a_cut_jpeg_gets_the_cpu_paths_400(nvjpeg):
    """A PNG comes back as a host array. A JPEG cut short (no end marker) goes to the CPU decoder, which
    refuses it with the same message as the CPU path: the tensor, the element and "corrupt or truncated"."""
    import cv2

    from fastpath.errors import InvalidInputError
    from fastpath.models.text_detection.probe import images_from_bytes

    image = skimage_rgb("page.png")
    ok, png = cv2.imencode(".png", image)
    (host,) = nvjpeg.images(ProbedRequest([png.tobytes()], [image.shape[:2]]))
    assert isinstance(host, np.ndarray) and host.shape == (*image.shape[:2], 3)
    photo = skimage_rgb("chelsea.png")
    cut = jpeg(photo)[: len(jpeg(photo)) * 6 // 10]
    limits = {"max_image_pixels": 1 << 24, "max_request_pixels": 1 << 24, "max_images": 4}
    with pytest.raises(InvalidInputError) as on_cpu:
        images_from_bytes(np.array([cut], dtype=object), **limits)
    with pytest.raises(InvalidInputError) as on_gpu:
        nvjpeg.images(ProbedRequest([cut], [photo.shape[:2]]))
    assert str(on_gpu.value) == str(on_cpu.value) and "input IMAGE_BYTES element 0" in str(on_gpu.value)


@pytest.mark.gpu
def test_the_warm_up_captures_a_graph_per_batch_bucket_and_seeds_the_cost_model_from_replays(gpu):
    """The served model's warm-up (warm_up_device) captures the graph of every (batch bucket, shape) it is given at
    load, so the first requests of those shapes replay graphs, and the cost model holds each bucket's replay time."""
    from fastpath.models.text_detection.device_batches import warm_up_device
    from fastpath.scheduling.clock import MonotonicClock
    from fastpath.scheduling.costs import CostModel

    pool = create_host_pool(PoolConfig(capacity_bytes=256 << 20, max_block_bytes=128 << 20), name="warm", device="cuda:0")
    handler, costs = DeviceBatchHandler(gpu, pool), CostModel()
    before = gpu.engine.stats()
    warm_up_device(handler, costs, MonotonicClock(), (1, 2), [(704, 960)])
    after = gpu.engine.stats()
    assert {(1, 704, 960), (2, 704, 960)} <= set(gpu.engine.graph_shapes)
    assert after.graph_runs - before.graph_runs >= 4 and after.eager_runs == before.eager_runs
    cells = (704 // 32) * (960 // 32)
    assert {(1, cells), (2, cells)} <= set(costs.measured())
    assert pool.stats().bytes_in_use == 0
    pool.close()


@pytest.mark.gpu
def test_graphs_in_sessions_of_their_own_replay_each_shapes_own_maps(gpu):
    """cuda_graph_session_per_shape: each captured shape runs in a session of its own. Replays of two shapes,
    interleaved over three rounds with a different image each time, return the graph-free session's maps of their
    own images (within float32 algorithm noise, 1e-4), and every call after the captures is a replay, a run on the bound
    device buffers alone (run_resident) included."""
    import dataclasses

    per_shape = TextDetector.from_directory(VERSION_DIR, dataclasses.replace(CONFIG, cuda_graph_session_per_shape=True),
                                            device="cuda:0", batch_sizes=(1, 2))
    graph_free = TextDetector.from_directory(VERSION_DIR, dataclasses.replace(CONFIG, max_cuda_graphs=0), device="cuda:0",
                                             batch_sizes=(1, 2))
    shapes = [(1, 736, 992), (2, 704, 960)]
    assert per_shape.engine.capture(shapes) == 2
    captured = per_shape.engine.stats()
    rng = np.random.default_rng(1)
    for _ in range(3):
        for size, height, width in shapes:
            images = rng.integers(0, 256, (size, height, width, 3), dtype=np.uint8)
            got, expected = (np.empty((size, height, width), np.float32) for _ in range(2))
            assert per_shape.engine.run_into(images, got) == "graph"
            assert graph_free.engine.run_into(images, expected) == "eager"
            np.testing.assert_allclose(got, expected, atol=1e-4)
    assert per_shape.engine.run_resident(shapes[1]) == "graph" and graph_free.engine.run_resident(shapes[1]) == "eager"
    assert per_shape.engine.stats().graph_runs - captured.graph_runs == 7 and set(per_shape.engine.graph_shapes) == set(shapes)
    per_shape.close()
    graph_free.close()


@pytest.mark.gpu
def test_graph_free_batches_on_sessions_of_their_own_shape_return_the_shared_sessions_maps(gpu):
    """cuda_eager_session_per_shape: a batch of a shape without a graph runs one image per call on a session of
    that (height, width) alone. Invariants: each image's map equals the shared graph-free session's map of the
    same batch (within float32 algorithm noise, 1e-4); a batch of B images makes B graph-free runs; a second
    shape gets a session of its own and the first shape's maps stay right after it."""
    import dataclasses

    graph_free = dataclasses.replace(CONFIG, max_cuda_graphs=0)
    per_shape = TextDetector.from_directory(VERSION_DIR, dataclasses.replace(graph_free, cuda_eager_session_per_shape=True),
                                            device="cuda:0", batch_sizes=(1, 2, 4))
    shared = TextDetector.from_directory(VERSION_DIR, graph_free, device="cuda:0", batch_sizes=(1, 2, 4))
    rng = np.random.default_rng(2)
    for size, height, width in ((3, 736, 992), (2, 704, 960), (4, 736, 992)):
        images = rng.integers(0, 256, (size, height, width, 3), dtype=np.uint8)
        got, expected = (np.empty((size, height, width), np.float32) for _ in range(2))
        before = per_shape.engine.stats().eager_runs
        assert per_shape.engine.run_into(images, got) == "eager" and shared.engine.run_into(images, expected) == "eager"
        assert per_shape.engine.stats().eager_runs - before == size
        np.testing.assert_allclose(got, expected, atol=1e-4)
    per_shape.close()
    shared.close()


@pytest.mark.gpu
def test_every_cuda_session_runs_on_the_calling_thread_alone_without_spinning(gpu):
    """cuda_intra_op_threads 1 (the default): the graph-free session, and a graph session once a shape is captured,
    have one intra-op thread and spinning off, so no pool worker busy-waits after a run; the maps are unchanged by it
    (the other tests here run with it)."""
    engine = gpu.engine
    engine.capture([(1, 736, 992)])
    sessions = [engine._eager._session] + [binding.session for binding in engine._graphs.values()]
    assert len(sessions) >= 2
    for session in sessions:
        options = session.get_session_options()
        assert options.intra_op_num_threads == 1
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
