"""Scheduler batches for text detection on a GPU: uint8 staging, one H2D, one run, one D2H.

:class:`DeviceBatchHandler` is the :class:`~fastpath.scheduling.BatchHandler` of a ``KIND_GPU`` ``text_detection``
instance. A batch (:class:`~fastpath.scheduling.ExactShapePolicy`, keyed by the shape bucket (Hb, Wb) of
:class:`~fastpath.graphs.ImageSideBuckets`) holds :class:`~fastpath.models.text_detection.pipeline.PreparedImage`
payloads whose resized (h, w) fit the bucket:

    stage   lease a page-locked block of ``batch_size * Hb * Wb * 3`` bytes; each resized uint8 RGB image goes
            top-left in its row, black (0) around it; filler rows copy row 0.
    run     lease a block for the float32 maps [batch_size, Hb, Wb]; the engine copies the input in one DMA,
            runs (a graph replay for a captured bucket) and copies the maps back in one DMA; the input lease goes.
    finish  DB post-processing of each real image's map cropped to its (h, w), on the completion thread or over
            ``post_threads`` threads (OpenCV releases the GIL); the map lease goes after the last image.

:meth:`DeviceBatchHandler.close` releases the leases of batches staged but never run.
Design: docs/design/text_detection.md#on-a-gpu.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastpath.engines.onnxruntime.image_cuda import IMAGE_BYTES_PER_PIXEL, MAP_BYTES_PER_PIXEL
from fastpath.errors import EngineError
from fastpath.memory import BlockPool, Lease
from fastpath.models.text_detection.config import NETWORK_STRIDE_PX
from fastpath.models.text_detection.pipeline import PreparedImage, TextDetector
from fastpath.profiling import PROFILE
from fastpath.scheduling import Batch
from fastpath.workers import thread_pool

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class StagedImages:
    """A batch input in a staging-pool block, or on the GPU when its images were decoded there.

    Attributes:
        images: uint8 [batch_size, Hb, Wb, 3]: a view over ``lease`` (valid until release), or a torch
            tensor on the engine's GPU (``decode_device cuda``; ``lease`` is then None).
        lease: the pool lease, or None.
        count: real images (rows ``0..count-1``; the rest are filler).
    """

    images: Any
    lease: Lease | None
    count: int


@dataclasses.dataclass(eq=False)
class DeviceMaps:
    """A batch's probability maps in a staging-pool block.

    Attributes:
        maps: float32 [count, Hb, Wb] view over ``lease`` (valid until :meth:`DeviceBatchHandler.finish` releases it).
        lease: the pool lease.
    """

    maps: np.ndarray
    lease: Lease


def stage_padded(images: Sequence[PreparedImage], out: np.ndarray) -> np.ndarray:
    """Write resized images into ``out`` (uint8 [B, Hb, Wb, 3], B >= len(images)), each at the top-left of
    its row with black (0) to its bottom and right; rows from len(images) on copy row 0. Returns ``out``.

    Raises:
        EngineError: no images, more images than rows, or an image larger than the bucket.
    """
    rows, height, width = out.shape[:3]
    if not images or len(images) > rows:
        raise EngineError(f"a staged detection batch needs 1..{rows} images; got {len(images)}")
    for row, item in enumerate(images):
        h, w = item.shape_hw
        if h > height or w > width:
            raise EngineError(f"an image resized to {h}x{w} does not fit the bucket {height}x{width}")
        target = out[row]
        target[:h, :w] = item.resized
        if h < height:
            target[h:] = 0
        if w < width:
            target[:h, w:] = 0
    out[len(images):] = out[0]
    return out


def stage_on_device(images: Sequence[PreparedImage], batch_size: int, bucket_hw: tuple[int, int], device: Any) -> Any:
    """:func:`stage_padded` into a new uint8 [batch_size, Hb, Wb, 3] torch tensor on ``device`` (``decode_device cuda``);
    an image still on the host is copied up. The tensor is ready when this returns (its stream synchronized).

    Raises:
        EngineError: see :func:`stage_padded`.
    """
    import torch

    from fastpath.models.text_detection.device_decode import synchronize

    on_device = [item if isinstance(item.resized, torch.Tensor) else
                 PreparedImage(torch.from_numpy(np.ascontiguousarray(item.resized)), item.source_hw) for item in images]
    out = stage_padded(on_device, torch.empty((batch_size, *bucket_hw, 3), dtype=torch.uint8, device=device))
    synchronize(out)
    return out


class DeviceBatchHandler:
    """Stages, runs and delivers one scheduler batch of images on a GPU engine.

    Args:
        detector: pre/post-processing and the GPU engine
            (:class:`~fastpath.engines.onnxruntime.image_cuda.OnnxRuntimeCudaImageEngine`).
        pool: host staging pool (page-locked); the handler leases from it, the caller owns it.
        lease_timeout_s: how long a lease waits for a free block (None: the pool's default); then
            the batch fails with UnavailableError (503, retryable).
        on_batch: called after each delivered batch (pool metrics); its errors are logged.
        post_threads: threads for DB post-processing (0: the completion thread does it).
        thread_pool_order: which idle post thread takes the next image (:data:`fastpath.workers.ORDERS`).
    """

    def __init__(self, detector: TextDetector, pool: BlockPool, *, lease_timeout_s: float | None = None,
                 on_batch: Callable[[], None] | None = None, post_threads: int = 0, thread_pool_order: str = "fifo") -> None:
        self.detector = detector
        self.engine = detector.engine
        self.pool = pool
        self.lease_timeout_s = lease_timeout_s
        self.on_batch = on_batch
        self._post = thread_pool(thread_pool_order, post_threads, "text_detection-post") if post_threads else None
        self._live: dict[int, Lease] = {}
        self._lock = threading.Lock()

    def stage(self, batch: Batch) -> StagedImages:
        """Lease and fill uint8 [batch.batch_size, Hb, Wb, 3], the bucket being the items' queue key."""
        return self.stage_images([item.payload for item in batch.items], batch.batch_size, batch.items[0].shape)

    def stage_images(self, images: Sequence[PreparedImage], batch_size: int, bucket_hw: tuple[int, int]) -> StagedImages:
        """Lease a block and write ``images`` padded to ``bucket_hw`` into rows 0.., filler after.

        Raises:
            EngineError: see :func:`stage_padded`.
            UnavailableError: the pool stayed exhausted for the lease timeout (retryable).
        """
        height, width = bucket_hw
        if any(not isinstance(item.resized, np.ndarray) for item in images):  # decoded on the GPU: stage there
            device = next(item.resized.device for item in images if not isinstance(item.resized, np.ndarray))
            return StagedImages(stage_on_device(images, batch_size, bucket_hw, device), None, len(images))
        lease = self.pool.lease(batch_size * height * width * IMAGE_BYTES_PER_PIXEL, timeout_s=self.lease_timeout_s)
        try:
            staged = stage_padded(images, lease.view(np.uint8, (batch_size, height, width, 3)))
        except BaseException:
            lease.release()
            raise
        with self._lock:
            self._live[id(lease)] = lease
        return StagedImages(staged, lease, len(images))

    def run(self, staged: StagedImages) -> DeviceMaps:
        """One engine call into a leased map block; releases the input lease (a device batch: its tensor)."""
        with self._lock:
            self._live.pop(id(staged.lease), None)
        try:
            rows, height, width = (int(side) for side in staged.images.shape[:3])
            out = self.pool.lease(rows * height * width * MAP_BYTES_PER_PIXEL, timeout_s=self.lease_timeout_s)
            try:
                maps = out.view(np.float32, (rows, height, width))
                if staged.lease is None:
                    self.engine.run_device_into(staged.images.data_ptr(), (rows, height, width), maps)
                else:
                    self.engine.run_into(staged.images, maps)
            except BaseException:
                out.release()
                raise
            return DeviceMaps(maps[: staged.count], out)
        finally:
            if staged.lease is not None:
                staged.lease.release()
            staged.images = None  # a device batch's memory goes back to torch's cache

    def finish(self, batch: Batch, result: DeviceMaps) -> None:
        """Post-process each real image on its own region of the map (here or on the post threads);
        the map block is released after the last one."""
        if self._post is None:
            try:
                for item, prob_map in zip(batch.items, result.maps):
                    self._deliver(item, prob_map)
            finally:
                result.lease.release()
        else:
            remaining = [len(batch.items)]
            lock = threading.Lock()

            def one(item: Any, prob_map: np.ndarray) -> None:
                try:
                    self._deliver(item, prob_map)
                finally:
                    with lock:
                        remaining[0] -= 1
                        last = not remaining[0]
                    if last:
                        result.lease.release()

            for item, prob_map in zip(batch.items, result.maps):
                self._post.submit(one, item, prob_map)
        if self.on_batch is not None:
            try:
                self.on_batch()
            except Exception:  # metrics must never cost an answer
                LOG.exception("the per-batch hook of the detection handler failed")

    def _deliver(self, item: Any, prob_map: np.ndarray) -> None:
        """One image's detections (or the error of its post-processing) into its ticket."""
        height, width = item.payload.shape_hw
        mark = PROFILE.start()
        try:
            detection = self.detector.finish(item.payload, prob_map[:height, :width])
        except Exception as exc:  # this image's request fails alone
            item.ticket.fail(exc)
            return
        PROFILE.lap("post.db", mark)
        item.ticket.set_row(item.row, detection)

    def close(self) -> int:
        """Release the leases of batches staged but never run; returns how many. Idempotent."""
        if self._post is not None:
            self._post.shutdown(wait=True)  # images being post-processed are answered first
        with self._lock:
            leftover, self._live = list(self._live.values()), {}
        for lease in leftover:
            lease.release()
        return len(leftover)


def warm_up_device(handler: DeviceBatchHandler, costs: Any, clock: Any, batch_buckets: Sequence[int],
                   buckets_hw: Sequence[tuple[int, int]]) -> None:
    """Capture the graphs of ``buckets_hw`` x ``batch_buckets`` and seed the cost model from them.

    For each bucket and batch size: the engine captures its graph (white images; ``capture``; regular
    runs when it has no graph session), then white images go through stage and run once untimed and once
    timed (graph replays where captured); the timed
    run's seconds seed ``costs`` at (batch size, 32x32 cells of the bucket).
    """
    for height, width in buckets_hw:
        image = PreparedImage(np.full((height, width, 3), 255, np.uint8), (height, width))
        cells = (height // NETWORK_STRIDE_PX) * (width // NETWORK_STRIDE_PX)
        for size in batch_buckets:
            handler.engine.capture([(size, height, width)])
            for timed in (False, True):
                staged = handler.stage_images([image] * size, size, (height, width))
                start_s = clock.now()
                handler.run(staged).lease.release()
                if timed:
                    costs.observe(size, cells, clock.now() - start_s)
