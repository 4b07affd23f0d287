"""Scheduler batches for text detection: stage into the host staging pool, run, post-process.

:class:`DetectionBatchHandler` is the :class:`~fastpath.scheduling.BatchHandler` of
``text_detection``. A batch (from :class:`~fastpath.scheduling.ExactShapePolicy`) holds
:class:`~fastpath.models.text_detection.pipeline.PreparedImage` payloads of one resized shape (h, w):

    stage   lease one block of ``batch_size * 3 * h * w * 4`` bytes from the host staging pool
            (``fastpath.memory``: page-locked when CUDA is present, page-aligned otherwise) and write
            each image's normalized BGR planes into its row: that single copy is the batching.
            Rows past the real images (filler, when the queue padded up to a batch bucket) are
            copies of row 0; they never reach a response.
    run     one engine call on the block; the lease is released right after it, success or not.
    finish  DB post-processing of each real row's map on the completion thread, one
            ``Detection`` per image into its request's ticket.

Leases of batches that were staged but never ran (an unload whose drain timed out) are released
by :meth:`DetectionBatchHandler.close`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastpath.errors import ConfigError
from fastpath.memory import BlockPool, Lease
from fastpath.models.text_detection.pipeline import PreparedImage, TextDetector, batch_shape
from fastpath.profiling import PROFILE
from fastpath.scheduling import Batch

LOG = logging.getLogger(__name__)
FLOAT32_BYTES = 4


@dataclasses.dataclass(eq=False)
class StagedBatch:
    """A batch input in a staging-pool block.

    Attributes:
        feed: float32 [batch_size, 3, h, w] view over ``lease``; None once :meth:`DetectionBatchHandler.run`
            released the lease.
        lease: the pool lease.
        images: real images (rows ``0..images-1``; the rest are filler).
    """

    feed: np.ndarray | None
    lease: Lease
    images: int


def feed_bytes(batch_size: int, shape_hw: tuple[int, int]) -> int:
    """Bytes of a float32 [batch_size, 3, h, w] feed."""
    return batch_size * 3 * shape_hw[0] * shape_hw[1] * FLOAT32_BYTES


def check_staging_fits(pool: BlockPool, largest_batch: int, largest_resized_pixels: int) -> None:
    """Refuse a configuration whose largest batch can never be staged; warn when the pool holds only one of
    its blocks (batch N+1 is then staged only after N's block comes back: no overlap, and a wait longer than
    ``staging_wait_timeout_s`` answers 503).

    Args:
        largest_batch: most images per engine call.
        largest_resized_pixels: most height * width of one resized image
            (``TextDetectionConfig.largest_resized_pixels``).

    Raises:
        ConfigError: ``largest_batch`` images of ``largest_resized_pixels`` exceed the pool's
            largest block; names both and the knobs to change.
    """
    needed = feed_bytes(largest_batch, (largest_resized_pixels, 1))
    if needed > pool.config.max_block_bytes:
        raise ConfigError(
            f"config.pbtxt parameter 'staging_capacity_bytes' = {pool.config.capacity_bytes}: a batch of {largest_batch} "
            f"images of {largest_resized_pixels} resized pixels needs {needed} bytes of float32 input, above the pool's "
            f"largest block ({pool.config.max_block_bytes} bytes); raise staging_capacity_bytes or lower batch_buckets, "
            "limit_side_len_px or max_resized_pixels"
        )
    block = pool.size_class(needed)
    if 2 * block > pool.config.capacity_bytes:
        LOG.warning("config.pbtxt parameter 'staging_capacity_bytes' = %d holds one %d-byte block of the largest batch "
                    "(%d images of %d resized pixels), not two: the next batch is staged only after the running one's "
                    "block comes back, and a wait over staging_wait_timeout_s answers 503; give it at least %d bytes",
                    pool.config.capacity_bytes, block, largest_batch, largest_resized_pixels, 2 * block)


class DetectionBatchHandler:
    """Stages, runs and delivers one scheduler batch of images.

    Args:
        detector: engine and pre/post-processing of the served version.
        pool: host staging pool; the handler leases from it, the caller owns (and closes) it.
        lease_timeout_s: how long a lease waits for a free block (None: the pool's default);
            then the batch fails with UnavailableError (503, retryable).
        on_batch: called after each delivered batch (e.g. pushing pool metrics); its errors are
            logged, never passed to a response.
    """

    def __init__(self, detector: TextDetector, pool: BlockPool, *, lease_timeout_s: float | None = None,
                 on_batch: Callable[[], None] | None = None) -> None:
        self.detector = detector
        self.pool = pool
        self.lease_timeout_s = lease_timeout_s
        self.on_batch = on_batch
        self._live: dict[int, Lease] = {}
        self._lock = threading.Lock()

    def stage(self, batch: Batch) -> StagedBatch:
        """Lease and fill float32 [batch.batch_size, 3, h, w] (the scheduler's stage step)."""
        return self.stage_images([item.payload for item in batch.items], batch.batch_size)

    def stage_images(self, images: Sequence[PreparedImage], batch_size: int) -> StagedBatch:
        """Lease a block and write ``images`` (one resized shape) into rows 0.., filler after.

        Raises:
            EngineError: the images mix shapes, or ``batch_size`` < len(images).
            UnavailableError: the pool stayed exhausted for the lease timeout (retryable).
        """
        height, width = batch_shape(images)
        lease = self.pool.lease(feed_bytes(batch_size, (height, width)), timeout_s=self.lease_timeout_s)
        try:
            feed = self.detector.fill(images, lease.view(np.float32, (batch_size, 3, height, width)))
        except BaseException:
            lease.release()
            raise
        with self._lock:
            self._live[id(lease)] = lease
        return StagedBatch(feed, lease, len(images))

    def run(self, staged: StagedBatch) -> np.ndarray:
        """One engine call; returns float32 [images, h, w] maps (a new array). Releases the lease."""
        with self._lock:  # from here on the lease is this call's: close() no longer releases it
            self._live.pop(id(staged.lease), None)
        try:
            return self.detector.infer(staged.feed)[: staged.images]
        finally:
            staged.feed = None  # no view outlives the lease: an idle block can then be freed at once
            staged.lease.release()

    def finish(self, batch: Batch, maps: np.ndarray) -> None:
        """Post-process each real image and hand its ``Detection`` to its ticket."""
        for item, prob_map in zip(batch.items, maps):
            mark = PROFILE.start()
            detection = self.detector.finish(item.payload, prob_map)
            PROFILE.lap("post.db", mark)
            item.ticket.set_row(item.row, detection)
        if self.on_batch is not None:
            try:
                self.on_batch()
            except Exception:  # metrics must never cost an answer
                LOG.exception("the per-batch hook of the detection handler failed")

    def close(self) -> int:
        """Release the leases of batches staged but never run (not those running); returns how many. Idempotent."""
        with self._lock:
            leftover, self._live = list(self._live.values()), {}
        for lease in leftover:
            lease.release()
        return len(leftover)


def warm_up(handler: DetectionBatchHandler, costs: Any, clock: Any, batch_sizes: Sequence[int],
            shapes_hw: Sequence[tuple[int, int]] = ((320, 320), (640, 640))) -> None:
    """Run a few batch shapes through the pool and engine to warm them and seed the cost model.

    For each resized shape and each batch bucket of 1 and 2 images: one untimed run, then one
    timed run whose seconds seed ``costs`` at (batch size, 32x32 cells of the shape). How long it
    takes: docs/design/text_detection.md ("Warm-up").
    """
    sizes = [size for size in batch_sizes if size in (1, 2)]
    for height, width in shapes_hw:
        image = handler.detector.prepare(np.full((height, width, 3), 255, np.uint8))
        for size in sizes:
            for timed in (False, True):
                staged = handler.stage_images([image] * size, size)
                start_s = clock.now()
                handler.run(staged)
                if timed:
                    costs.observe(size, image.cells, clock.now() - start_s)
