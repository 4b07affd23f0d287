"""DetectionBatchHandler with the real PP-OCRv4 artifact, a real staging pool and the real BatchRunner.

What text_detection serves, without Triton: images bucketed by resized shape (ExactShapePolicy),
staged into one pool block per batch, one engine call, DB post-processing per image. Every result
must equal the same image detected alone (``TextDetector.detect([image])``), byte for byte.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from fastpath.artifacts.detection import build_text_detection
from fastpath.errors import ConfigError, UnavailableError
from fastpath.memory import BlockPool, PageAlignedAllocator, PoolConfig
from fastpath.models.text_detection.batches import DetectionBatchHandler, check_staging_fits, feed_bytes, warm_up
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.pipeline import TextDetector
from fastpath.scheduling import BatchQueue, BatchRunner, CostModel, ExactShapePolicy, MonotonicClock, Ticket, WorkItem
from tests.unit.models.text_detection.reference import skimage_rgb

CONFIG = TextDetectionConfig(intra_op_threads=1)
MIB = 1 << 20


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repository")
    build_text_detection(repository)
    detector = TextDetector.from_directory(repository / "text_detection" / "1", CONFIG)
    yield detector
    detector.close()


def make_pool(capacity_bytes: int = 256 * MIB, wait_timeout_s: float = 1.0) -> BlockPool:
    return BlockPool(PageAlignedAllocator(), PoolConfig(capacity_bytes=capacity_bytes, max_block_bytes=capacity_bytes,
                                                        wait_timeout_s=wait_timeout_s), name="staging")


class Answers:
    """Collects ticket answers: label -> (detections, error)."""

    def __init__(self) -> None:
        self.by_label: dict[str, tuple] = {}
        self._cond = threading.Condition()

    def __call__(self, ticket, results, error) -> None:
        with self._cond:
            assert ticket.label not in self.by_label, "a ticket was answered twice"
            self.by_label[ticket.label] = (results, error)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 120.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.by_label) >= count, timeout=timeout_s), self.by_label.keys()


def request_items(detector, answers, label, images):
    prepared = [detector.prepare(image) for image in images]
    ticket = Ticket(len(prepared), answers, label=label)
    return [WorkItem(ticket, row, p.cells, p, shape=p.shape_hw) for row, p in enumerate(prepared)]


def assert_same(detection, alone):
    np.testing.assert_array_equal(detection.boxes, alone.boxes)
    np.testing.assert_array_equal(detection.scores, alone.scores)


def test_filler_rows_leave_the_real_rows_maps_unchanged(detector):
    page = detector.prepare(skimage_rgb("page.png"))
    flipped = detector.prepare(np.ascontiguousarray(skimage_rgb("page.png")[::-1]))
    h, w = page.shape_hw
    feed = detector.fill([page, flipped], np.empty((4, 3, h, w), np.float32))
    np.testing.assert_array_equal(feed[2], feed[0])
    np.testing.assert_array_equal(feed[3], feed[0])
    maps = detector.infer(feed)
    np.testing.assert_array_equal(maps[0], detector.run_batch([page])[0])
    np.testing.assert_array_equal(maps[1], detector.run_batch([flipped])[0])


def test_scheduled_requests_of_mixed_shapes_equal_each_image_alone_and_release_every_lease(detector):
    page, text, coffee = skimage_rgb("page.png"), skimage_rgb("text.png", 2.0), skimage_rgb("coffee.png")
    white = np.full((191, 384, 3), 255, np.uint8)
    requests = {"page": [page], "mixed": [text, page, white], "pages": [page, page[:, ::-1].copy()],
                "coffee": [coffee], "text": [text], "white": [white, white]}
    pool, answers = make_pool(), Answers()
    handler = DetectionBatchHandler(detector, pool)
    queue = BatchQueue(ExactShapePolicy(batch_sizes=(1, 2, 4), costs=CostModel(), max_queue_delay_s=0.0), max_items=64)
    runner = BatchRunner(queue, handler, clock=MonotonicClock(), name="test-detection").start()
    try:
        for label, images in requests.items():
            runner.submit(request_items(detector, answers, label, images))
        answers.wait_for(len(requests))
    finally:
        runner.close(drain_timeout_s=60)
    for label, images in requests.items():
        detections, error = answers.by_label[label]
        assert error is None and len(detections) == len(images)
        for image, detection in zip(images, detections):
            assert_same(detection, detector.detect([image])[0])
    assert [len(d.boxes) for d in answers.by_label["mixed"][0]][1:] == [5, 0]
    stats = pool.stats()
    assert stats.outstanding == 0 and 4 <= stats.leases < 11 and pool.close().ok  # 11 images, fewer engine calls
    assert handler.close() == 0


def test_a_batch_that_cannot_be_staged_fails_alone_with_503_and_the_next_one_runs(detector):
    """The pool exhausted (a block held elsewhere, no wait): that batch's request gets UnavailableError;
    after the block returns, the next request is served normally."""
    pool, answers = make_pool(capacity_bytes=8 * MIB, wait_timeout_s=0.0), Answers()
    handler = DetectionBatchHandler(detector, pool)
    queue = BatchQueue(ExactShapePolicy(batch_sizes=(1, 2), costs=CostModel(), max_queue_delay_s=0.0), max_items=16)
    runner = BatchRunner(queue, handler, clock=MonotonicClock(), name="test-detection").start()
    page = skimage_rgb("page.png")
    try:
        held = pool.lease(8 * MIB)
        runner.submit(request_items(detector, answers, "starved", [page]))
        answers.wait_for(1)
        held.release()
        runner.submit(request_items(detector, answers, "served", [page]))
        answers.wait_for(2)
    finally:
        runner.close(drain_timeout_s=60)
    _, error = answers.by_label["starved"]
    assert isinstance(error, UnavailableError) and "exhausted" in str(error)
    detections, error = answers.by_label["served"]
    assert error is None
    assert_same(detections[0], detector.detect([page])[0])
    assert pool.stats().outstanding == 0 and pool.stats().exhausted == 1


def test_close_releases_leases_of_batches_staged_but_never_run(detector):
    pool = make_pool()
    handler = DetectionBatchHandler(detector, pool)
    image = detector.prepare(np.zeros((64, 96, 3), np.uint8))
    staged = handler.stage_images([image], 2)
    assert staged.feed.shape == (2, 3, 64, 96) and staged.lease.nbytes == feed_bytes(2, (64, 96))
    ran = handler.stage_images([image], 1)
    assert handler.run(ran).shape == (1, 64, 96)
    assert pool.stats().outstanding == 1
    assert handler.close() == 1 and handler.close() == 0
    assert pool.stats().outstanding == 0


def test_a_run_batch_leaves_no_view_of_its_block_so_the_idle_block_can_be_freed_at_once(detector):
    """Invariant: once run() returned, the batch's staging block is idle and no view of it is alive, so
    BlockPool.release_idle frees it immediately (no deferred free) while the staged batch object still exists."""
    pool = make_pool()
    handler = DetectionBatchHandler(detector, pool)
    image = detector.prepare(np.zeros((64, 96, 3), np.uint8))
    staged = handler.stage_images([image], 1)
    handler.run(staged)
    assert staged.feed is None and pool.stats().outstanding == 0
    assert pool.release_idle(keep_bytes=0) == pool.size_class(feed_bytes(1, (64, 96)))
    assert pool.allocator.frees == 1 and pool.allocator.deferred_frees == 0


def test_warm_up_seeds_the_cost_model_per_batch_size_and_shape(detector):
    pool, costs = make_pool(), CostModel()
    warm_up(DetectionBatchHandler(detector, pool), costs, MonotonicClock(), (1, 2, 4), shapes_hw=((64, 64), (128, 96)))
    assert sorted(costs.measured()) == [(1, 4), (1, 12), (2, 4), (2, 12)]
    assert all(seconds > 0 for seconds in costs.measured().values())
    assert pool.stats().outstanding == 0


def test_staging_pool_too_small_for_the_largest_batch_refuses_to_load(caplog):
    """Invariant: below one block of the largest batch the model refuses to load; with room for one block but
    not two it loads with a warning naming the bytes for two (staging N+1 while N runs needs two)."""
    with pytest.raises(ConfigError, match="batch of 8 images of 921600 resized pixels needs 88473600 bytes"):
        check_staging_fits(make_pool(capacity_bytes=64 * MIB), 8, 960 * 960)
    with caplog.at_level(logging.WARNING, logger="fastpath.models.text_detection.batches"):
        check_staging_fits(make_pool(capacity_bytes=128 * MIB), 8, 960 * 960)
        assert [r.getMessage() for r in caplog.records] == [
            f"config.pbtxt parameter 'staging_capacity_bytes' = {128 * MIB} holds one {128 * MIB}-byte block of the "
            "largest batch (8 images of 921600 resized pixels), not two: the next batch is staged only after the running "
            f"one's block comes back, and a wait over staging_wait_timeout_s answers 503; give it at least {256 * MIB} bytes"]
        caplog.clear()
        check_staging_fits(make_pool(capacity_bytes=256 * MIB), 8, 960 * 960)
        assert caplog.records == []
