"""``TritonPythonModel`` for text detection (``model_repository/text_detection``).

Tensors (:data:`TextDetectionModel.INPUTS`/``OUTPUTS``, checked against ``config.pbtxt`` at load;
max_batch_size 0, so these are the full request shapes; docs/models.md). A request carries exactly one
of ``IMAGE`` (UINT8 [N, H, W, C], N raw images of one size, C = 1, 2, 3 or 4) or ``IMAGE_BYTES``
(BYTES [N], PNG/JPEG files of any sizes); the answer is ``BOXES`` (FP32 [K, 4, 2], (x, y) corners
clockwise from top-left), ``SCORES`` (FP32 [K]) and ``BOX_COUNTS`` (INT32 [N]: image i owns the next
BOX_COUNTS[i] rows).

``execute`` decodes, validates and resizes each request's images (a bad request gets its own 400 at
once), queues one work item per image (:class:`~fastpath.scheduling.ExactShapePolicy`: batches of one
resized shape) and returns ``None``; the scheduler's threads stage, run and post-process each batch and
answer each request once its last image is done. A full queue is 503 / UNAVAILABLE; an engine error
fails only its batch's requests. After each batch a :class:`~fastpath.memory.MemoryReturner` gives idle
staging blocks and the C heap back; the peak is bounded by :mod:`fastpath.models.text_detection.budget`.
Design: docs/design/text_detection.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from fastpath.config import instance_device
from fastpath.errors import ConfigError, InvalidInputError, RequestCancelledError
from fastpath.graphs import ImageSideBuckets
from fastpath.graphs.buckets import Sizes
from fastpath.manifest import verify_manifest
from fastpath.memory import MemoryReturner, PoolConfig, create_host_pool, cuda_ordinal
from fastpath.memory.cuda import use_blocking_sync
from fastpath.models.text_detection.batches import DetectionBatchHandler, check_staging_fits, warm_up
from fastpath.models.text_detection.budget import MemoryBudget, peak_budget
from fastpath.models.text_detection.config import NETWORK_STRIDE_PX, DetectionSchedulerConfig, TextDetectionConfig
from fastpath.models.text_detection.device_batches import DeviceBatchHandler, warm_up_device
from fastpath.models.text_detection.image import ARRAY_INPUT, BYTES_INPUT, check_array, check_image_count, images_from_array
from fastpath.models.text_detection.pipeline import PreparedImage, TextDetector, concatenate
from fastpath.models.text_detection.probe import ProbedRequest, probe_request
from fastpath.profiling import PROFILE
from fastpath.scheduling import BatchQueue, ExactShapePolicy, Ticket, WorkItem, ask_cancelled
from fastpath.triton.io import TensorSpec, input_rows, read_input
from fastpath.triton.requests import (
    Replies,
    priority_level,
    request_timeout_s,
    requested_outputs,
    select_outputs,
)
from fastpath.triton.scheduled import ScheduledModel
from fastpath.workers import thread_pool

LOG = logging.getLogger(__name__)
MODEL_NAME = "text_detection"


def staging_pool_config(config: TextDetectionConfig) -> PoolConfig:
    """Host staging pool limits: ``staging_capacity_bytes``, its largest power of two as the largest block."""
    capacity = config.staging_capacity_bytes
    return PoolConfig(capacity_bytes=capacity, max_block_bytes=1 << (capacity.bit_length() - 1),
                      wait_timeout_s=config.staging_wait_timeout_s)


def check_scheduler_fits(config: TextDetectionConfig, sched: DetectionSchedulerConfig) -> Sizes:
    """The scheduler's batch sizes (the GPU engine captures its graphs for them); refuses batch buckets
    above ``max_batch_images`` and a queue that cannot hold the largest request.

    Raises:
        ConfigError: naming the parameter, its value and what to change.
    """
    sizes = sched.batch_sizes(max_rows=config.max_batch_images, max_rows_name="max_batch_images")
    if config.max_images_per_request > sched.max_queue_images:
        raise ConfigError(f"config.pbtxt parameter 'max_queue_images' = {sched.max_queue_images} is below "
                          f"max_images_per_request={config.max_images_per_request}: the largest request could never be "
                          "queued; raise max_queue_images")
    return sizes


def _log_budget(pb_utils: Any, budget: MemoryBudget) -> None:
    """Write the memory budget to Triton's log (the stub's Python logging is not configured to show INFO)."""
    terms = ", ".join(f"{term} {value >> 20} MiB" for term, value in dataclasses.asdict(budget).items())
    message = f"text_detection memory budget: at most {budget.total_bytes >> 20} MiB above the idle stub for any legal request ({terms})"
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(message)
    else:
        LOG.info("%s", message)


def _after_batch(memory: MemoryReturner, on_metrics: Any) -> None:
    """The per-batch hook: give memory back first, so that pushed pool metrics show what stays."""
    memory.after_batch()
    if on_metrics is not None:
        on_metrics()


class TextDetectionModel(ScheduledModel):
    """The python-backend model class; ``model.py`` re-exports it as ``TritonPythonModel``."""

    NAME = MODEL_NAME
    CONFIG = TextDetectionConfig
    SCHEDULER_CONFIG = DetectionSchedulerConfig
    UNIT = "images"
    INPUTS = (TensorSpec(ARRAY_INPUT, "TYPE_UINT8", (-1, -1, -1, -1), optional=True),
              TensorSpec(BYTES_INPUT, "TYPE_STRING", (-1,), optional=True))
    OUTPUTS = (TensorSpec("BOXES", "TYPE_FP32", (-1, 4, 2)), TensorSpec("SCORES", "TYPE_FP32", (-1,)),
               TensorSpec("BOX_COUNTS", "TYPE_INT32", (-1,)))
    device_decoder: Any = None  # nvJPEG (decode_device cuda), set by load(); subclasses that skip load() decode on the CPU

    def load(self, args: dict[str, str], model_config: dict[str, Any]) -> Sizes:
        """The detector (on the GPU Triton assigned a KIND_GPU instance: ONNX Runtime's CUDA EP,
        ``gpu_artifact``, ``model.uint8.onnx`` by default), its staging pool and memory returner; the batch sizes, checked.

        Raises:
            ArtifactError: the artifact is not listed in its version's ``manifest.json``, or its size or sha256 differs.
        """
        self.batch_sizes = check_scheduler_fits(self.config, self.scheduler_config)
        self.device = instance_device(args, None, runtime=self.config.runtime, gpu_runtimes=("onnxruntime",))
        self.gpu = self.device.startswith("cuda")
        if self.config.opencv_threads:  # process-wide: decode and post-processing threads already run in parallel
            cv2.setNumThreads(self.config.opencv_threads)
        if self.gpu and self.config.cuda_blocking_sync:  # before the engine's sessions make the context
            use_blocking_sync(cuda_ordinal(self.device) or 0)
        self.buckets = ImageSideBuckets(self.config.bucket_sides_px)
        self.device_decoder = self._device_decoder()
        version_dir = Path(args["model_repository"]) / self.model_version
        artifact = self.config.gpu_artifact if self.gpu else self.config.artifact
        verify_manifest(version_dir, required=(artifact,), only_required=True)  # size and sha256, as built
        self.detector = TextDetector.from_directory(version_dir, self.config, device=self.device, batch_sizes=self.batch_sizes)
        self.pool = create_host_pool(staging_pool_config(self.config), name="staging", device=self.device if self.gpu else None)
        check_staging_fits(self.pool, self.batch_sizes.largest, self.config.largest_resized_pixels)
        if not self.gpu:  # the budget's engine terms are the CPU engine's (on a GPU they are device memory)
            _log_budget(self._pb, peak_budget(self.config, self.batch_sizes))
        self.memory = MemoryReturner([self.pool], keep_idle_bytes=self.config.staging_keep_idle_bytes,
                                     trim_growth_bytes=self.config.heap_trim_growth_bytes)
        return self.batch_sizes

    def _device_decoder(self) -> Any:
        """nvJPEG for ``decode_device cuda`` (a KIND_GPU instance only), else None.

        Raises:
            ConfigError: ``decode_device cuda`` on a CPU instance, or without a working torchvision nvJPEG.
        """
        if self.config.decode_device != "cuda":
            return None
        if not self.gpu:
            raise ConfigError(f"config.pbtxt parameter 'decode_device' = cuda needs a KIND_GPU instance on ONNX Runtime; "
                              f"this instance runs on {self.device}; set decode_device to cpu")
        from fastpath.models.text_detection.device_decode import DeviceJpegDecoder

        return DeviceJpegDecoder(self.device)

    def engine_stats(self) -> Callable[[], Any] | None:
        """The CUDA engine's copy and run counters (``EngineStats``); None on the CPU engine, which keeps none."""
        return getattr(self.detector.engine, "stats", None)

    def batch_handler(self, on_batch: Any) -> DetectionBatchHandler | DeviceBatchHandler:
        """The device or host batch handler; after each batch it gives memory back, then runs ``on_batch``."""
        after = functools.partial(_after_batch, self.memory, on_batch)
        if self.gpu:
            return DeviceBatchHandler(self.detector, self.pool, on_batch=after, post_threads=self.config.post_threads,
                                      thread_pool_order=self.config.thread_pool_order)
        return DetectionBatchHandler(self.detector, self.pool, on_batch=after)

    def batch_policy(self, sizes: Sizes) -> ExactShapePolicy:
        return ExactShapePolicy(batch_sizes=sizes, **self.scheduler_config.policy_options())

    def warm_up(self, queue: BatchQueue) -> None:
        if self.gpu:
            shapes = [self.bucket_of(shape) for shape in self.config.capture_shapes_hw] or [(736, 736)]
            warm_up_device(self.handler, queue.costs, self.runner.clock, self.batch_sizes, shapes)
        else:
            warm_up(self.handler, queue.costs, self.runner.clock, self.batch_sizes)

    def started(self) -> None:
        """Trim the idle stub (its level measured after the warm-up) and start the decode threads."""
        self.memory.after_batch()
        threads = self.config.decode_threads
        self.decoders = thread_pool(self.config.thread_pool_order, threads, f"{MODEL_NAME}-decode") if threads else None

    def bucket_of(self, shape_hw: tuple[int, int]) -> tuple[int, int]:
        """The queue key of a resized shape: its shape bucket, or the shape itself when the padded
        bucket would exceed ``max_resized_pixels`` (the staging check's bound) or there are no buckets."""
        bucket = self.buckets.snap(shape_hw)
        return bucket if bucket[0] * bucket[1] <= self.config.max_resized_pixels else tuple(shape_hw)

    def _prepare(self, image: Any) -> PreparedImage:
        """Resize for the network (on the GPU for an image decoded there); an image kept at its size is copied
        out of the request's tensor memory, which the queue must not hold on to after ``execute`` returns."""
        if not isinstance(image, np.ndarray):
            from fastpath.models.text_detection.device_decode import prepare_on_device

            return prepare_on_device(image, self.config)
        prepared = self.detector.prepare(image)
        if prepared.resized is image and image.base is not None:
            prepared = PreparedImage(np.array(image, copy=True), prepared.source_hw)
        return prepared

    def execute(self, requests: list[Any]) -> None:
        """Queue each request's images (decoded, checked and resized here or on the decode threads); answers follow."""
        pb = self._pb
        arrival_s = self.runner.clock.now()  # the call's requests wait while earlier ones decode: timeouts count from here
        replies = Replies(pb, requests, "sender", self.progress)
        for index, request in enumerate(requests):
            try:  # what can be checked without decoding the images is a 400 whatever the queue holds, never a retryable 503
                count = self._image_count(request)
                name = self._input_name(request)
                options = (priority_level(request, self.scheduler_config), request_timeout_s(request, self.scheduler_config),
                           requested_outputs(request), request.is_cancelled, replies.request_id(index) or "request")
                checked = self._check(read_input(pb, request, name), name)
            except Exception as exc:  # a bad request fails alone
                self.metrics.invalid_request()
                replies.fail(index, exc)
                continue
            if not (isinstance(checked, ProbedRequest) and checked.errors):  # a file known bad takes no queue room
                try:  # a full queue answers 503 before the images are copied and decoded, not 5-20 s late after them
                    self.runner.check_room(count)
                except Exception as exc:
                    replies.fail(index, exc)
                    continue
            if self.decoders is None:
                self._accept(replies, index, checked, name, options, arrival_s)
            else:  # the decode thread may outlive execute(): an IMAGE is copied out of the request's memory
                checked = np.array(checked, copy=True) if name == ARRAY_INPUT else checked
                self.decoders.submit(self._accept, replies, index, checked, name, options, arrival_s)
        return None

    def _input_name(self, request: Any) -> str:
        """The name of the request's one image input.

        Raises:
            InvalidInputError: the request has both image inputs, or neither.
        """
        present = [name for name in (ARRAY_INPUT, BYTES_INPUT) if self._pb.get_input_tensor_by_name(request, name) is not None]
        if len(present) != 1:
            raise InvalidInputError(f"send exactly one of the inputs {ARRAY_INPUT} (UINT8 [N, H, W, C]) or {BYTES_INPUT} "
                                    f"(BYTES [N], PNG/JPEG files); the request has {present or 'neither'}")
        return present[0]

    def _check(self, values: np.ndarray, name: str) -> np.ndarray | ProbedRequest:
        """What can be checked of input ``name`` without decoding: an ``IMAGE``'s shape (the array is returned), or
        each ``IMAGE_BYTES`` file's header (:class:`ProbedRequest`; an unreadable header is kept as its element's
        error, raised with the decode's by :meth:`_decode`).

        Raises:
            InvalidInputError: a wrong shape, no images, or a limit exceeded.
        """
        if name == ARRAY_INPUT:
            check_array(values, **self._limits)
            return values
        return probe_request(values, **self._limits)

    def images(self, request: Any) -> list[Any]:
        """The request's images, checked and decoded in the calling thread (a model without the scheduler).

        Raises:
            InvalidInputError: as :meth:`_check` and :meth:`_decode`.
        """
        name = self._input_name(request)
        return self._decode(self._check(read_input(self._pb, request, name), name), name)

    def _accept(self, replies: Replies, index: int, checked: np.ndarray | ProbedRequest, name: str, options: tuple,
                arrival_s: float) -> None:
        """Decode and resize request ``index``'s images (checked by :meth:`_check`) and queue them; a failure is the
        request's answer."""
        level, timeout_s, wanted, is_cancelled, label = options
        if self.decoders is not None and ask_cancelled(is_cancelled, label):  # it waited for a decode thread; its client gave up
            self.metrics.rejected("cancelled", len(checked.elements if isinstance(checked, ProbedRequest) else checked))
            replies.fail(index, RequestCancelledError("the request was cancelled before its images were decoded"))
            return
        mark = PROFILE.start()
        try:
            prepared = [self._prepare(image) for image in self._decode(checked, name)]
        except Exception as exc:  # a bad request fails alone
            self.metrics.invalid_request()
            replies.fail(index, exc)
            return
        PROFILE.lap("execute.decode", mark, len(prepared))
        ticket = Ticket(len(prepared), functools.partial(self._answer, replies, index, wanted), is_cancelled=is_cancelled,
                        label=label)
        items = []
        for row, image in enumerate(prepared):
            bucket = self.bucket_of(image.shape_hw)
            items.append(WorkItem(ticket, row, (bucket[0] // NETWORK_STRIDE_PX) * (bucket[1] // NETWORK_STRIDE_PX), image, level,
                                  shape=bucket))
        try:
            self.runner.submit(items, timeout_s=timeout_s, arrival_s=arrival_s)
        except Exception as exc:  # queue full or shutting down: UNAVAILABLE, retryable
            ticket.fail(exc)  # through the ticket: the request is answered once, whatever the queue kept

    @functools.cached_property
    def _limits(self) -> dict[str, int]:  # the config is fixed once loaded: one dict, not one per request
        config = self.config
        return {"max_image_pixels": config.max_image_pixels, "max_request_pixels": config.max_request_pixels,
                "max_images": config.max_images_per_request}

    def _decode(self, checked: np.ndarray | ProbedRequest, name: str) -> list[Any]:
        """The images of what :meth:`_check` returned: uint8 RGB arrays, or device tensors for JPEGs decoded on the GPU."""
        if name == ARRAY_INPUT:
            return images_from_array(checked, **self._limits)
        if self.device_decoder is not None:  # JPEGs to device tensors [3, H, W]; the rest decoded here
            return self.device_decoder.images(checked)
        return checked.decode()

    def _image_count(self, request: Any) -> int:
        """Images in the request by its input's batch dimension, without decoding (0 if malformed: _input_name says why).

        Raises:
            InvalidInputError: more than ``max_images_per_request`` images.
        """
        counts = [(name, rows) for name in (ARRAY_INPUT, BYTES_INPUT) if (rows := input_rows(self._pb, request, name)) is not None]
        if len(counts) != 1:
            return 0
        name, rows = counts[0]
        check_image_count(rows, tensor=name, max_images=self.config.max_images_per_request)
        return rows

    def _answer(self, replies: Replies, index: int, wanted: frozenset[str], ticket: Ticket, detections: list[Any] | None,
                error: BaseException | None) -> None:
        """The ticket's single answer: the request's detections as one ragged result (requested outputs only), or its error."""
        pb = self._pb
        if error is not None:
            replies.fail(index, error)
            return
        boxes, scores, counts = concatenate(detections)
        replies.answer(index, select_outputs(pb, [
            pb.Tensor("BOXES", boxes), pb.Tensor("SCORES", scores), pb.Tensor("BOX_COUNTS", counts)], wanted))

    def finalize(self) -> None:
        """Finish decoding accepted requests, then the shared drain (:meth:`ScheduledModel.finalize`)."""
        decoders = getattr(self, "decoders", None)
        if decoders is not None:
            decoders.shutdown(wait=True)
        stats = getattr(getattr(getattr(self, "detector", None), "engine", None), "stats", None)
        if stats is not None:
            LOG.info("text_detection engine on %s: %s", self.device, stats())
        super().finalize()

    def release(self) -> None:
        detector = getattr(self, "detector", None)
        if detector is not None:
            detector.close()
