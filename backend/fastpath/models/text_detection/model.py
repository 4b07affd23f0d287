"""``TritonPythonModel`` for text detection (``model_repository/text_detection``).

Inputs and outputs (see ``config.pbtxt``; max_batch_size 0, so the shapes below are the full
request shapes). A request carries exactly one of the two inputs:

    IMAGE        TYPE_UINT8  [N, H, W, C]  N raw images of one size, C = 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA.
    IMAGE_BYTES  TYPE_STRING [N]           N encoded PNG/JPEG files of any sizes (8- or 16-bit).
    BOXES        TYPE_FP32   [K, 4, 2]     every box of every image, (x, y) corners clockwise from top-left.
    SCORES       TYPE_FP32   [K]           one score per box.
    BOX_COUNTS   TYPE_INT32  [N]           boxes per image: image i owns rows sum(BOX_COUNTS[:i]) ... + BOX_COUNTS[i].

An image without text gives BOX_COUNTS 0 and, for a one-image request, BOXES [0, 4, 2] and
SCORES [0].

``execute`` decodes, validates and resizes each request's images in Triton's thread (a bad
request gets its own 400 at once), hands one work item per image to FastPath's scheduler
(:class:`~fastpath.scheduling.ExactShapePolicy`: batches of one resized shape, sizes snapped to
``batch_buckets``) and returns ``None``. The scheduler's threads stage each batch into the host
staging pool, run the engine, post-process, and answer each request through its response sender
once its last image is done. A full queue is 503 / UNAVAILABLE; an engine error fails only the
requests of that batch; ``finalize`` drains. Request options ``timeout`` and ``fastpath_priority``
as for ``text_embedding`` (:mod:`fastpath.triton.scheduled`). After each batch a
:class:`~fastpath.memory.MemoryReturner` frees idle staging blocks beyond ``staging_keep_idle_bytes``
and trims the C heap, so the stub returns near its idle size after a peak; the peak itself is
bounded by :mod:`fastpath.models.text_detection.budget`. Design: docs/design/text_detection.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.config import instance_device, parse_sections, triton_parameters
from fastpath.errors import ConfigError, InvalidInputError
from fastpath.graphs import ImageSideBuckets
from fastpath.graphs.buckets import Sizes
from fastpath.memory import MemoryReturner, PoolConfig, create_host_pool
from fastpath.models.text_detection.batches import DetectionBatchHandler, check_staging_fits, warm_up
from fastpath.models.text_detection.budget import MemoryBudget, peak_budget
from fastpath.models.text_detection.config import NETWORK_STRIDE_PX, DetectionSchedulerConfig, TextDetectionConfig
from fastpath.models.text_detection.device_batches import DeviceBatchHandler, warm_up_device
from fastpath.models.text_detection.image import ARRAY_INPUT, BYTES_INPUT, images_from_array, images_from_bytes
from fastpath.models.text_detection.pipeline import PreparedImage, TextDetector, concatenate
from fastpath.scheduling import BatchQueue, BatchRunner, ExactShapePolicy, Ticket, WorkItem
from fastpath.triton.heartbeat import Progress, start_heartbeat, stub_diagnostics
from fastpath.triton.io import error_response, input_rows, read_input
from fastpath.triton.scheduled import (
    Replies,
    close_scheduled,
    metrics_flusher,
    pool_metrics,
    priority_level,
    request_timeout_s,
    requested_outputs,
    scheduler_metrics,
    select_outputs,
)
from fastpath.triton.selftest import run_self_test
from fastpath.triton.watchdog import exit_with_server

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
    if config.max_images_per_request > sched.max_queue_texts:
        raise ConfigError(f"config.pbtxt parameter 'max_queue_texts' = {sched.max_queue_texts} (queued images) is below "
                          f"max_images_per_request={config.max_images_per_request}: the largest request could never be "
                          "queued; raise max_queue_texts")
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


class TextDetectionModel:
    """The python-backend model class; ``model.py`` re-exports it as ``TritonPythonModel``."""

    def initialize(self, args: dict[str, str]) -> None:
        """Parse the config, self-test the stub, load and check the engine, start the scheduler.

        Raises:
            ConfigError, SelfTestError, ArtifactError, EngineError: the model refuses to load,
                and Triton reports the message.
        """
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        log_filter = stub_diagnostics()
        run_self_test(pb_utils.Tensor)
        exit_with_server()  # a stub orphaned by a crashed or killed tritonserver exits (watchdog.py)
        model_config = json.loads(args["model_config"])
        self.config, self.scheduler_config = parse_sections(triton_parameters(model_config), TextDetectionConfig,
                                                            DetectionSchedulerConfig)
        sched = self.scheduler_config
        self.batch_sizes = check_scheduler_fits(self.config, sched)
        self.model_version = args["model_version"]
        # KIND_GPU: ONNX Runtime's CUDA EP on the GPU Triton assigned (model.uint8.onnx, device_batches.py)
        self.device = instance_device(args, None, runtime=self.config.runtime, gpu_runtimes=("onnxruntime",))
        gpu = self.device.startswith("cuda")
        self.buckets = ImageSideBuckets(self.config.bucket_sides_px)
        self.detector = TextDetector.from_directory(Path(args["model_repository"]) / self.model_version, self.config,
                                                    device=self.device, batch_sizes=self.batch_sizes)
        self.pool = create_host_pool(staging_pool_config(self.config), name="staging", device=self.device if gpu else None)
        check_staging_fits(self.pool, self.batch_sizes.largest, self.config.largest_resized_pixels)
        if not gpu:  # the budget's engine terms are the CPU engine's (on a GPU they are device memory)
            _log_budget(pb_utils, peak_budget(self.config, self.batch_sizes))
        self.handler = self._batch_handler(args, gpu)
        queue = BatchQueue(ExactShapePolicy(batch_sizes=self.batch_sizes, **sched.policy_options()),
                           max_items=sched.max_queue_texts, unit="images")
        self.progress = Progress()
        self.runner = BatchRunner(queue, self.handler, observer=self.metrics, name=args.get("model_name", MODEL_NAME),
                                  on_delivered=self.progress.advance, **sched.runner_options())
        if sched.warmup and gpu:
            shapes = [self.bucket_of(shape) for shape in self.config.capture_shapes_hw] or [(736, 736)]
            warm_up_device(self.handler, queue.costs, self.runner.clock, self.batch_sizes, shapes)
        elif sched.warmup:
            warm_up(self.handler, queue.costs, self.runner.clock, self.batch_sizes)
        self.memory.after_batch()  # the idle stub starts trimmed, its level measured after the warm-up
        threads = self.config.decode_threads
        self.decoders = ThreadPoolExecutor(threads, thread_name_prefix=f"{MODEL_NAME}-decode") if threads else None
        self.runner.start()
        self.heartbeat = start_heartbeat(args, self.progress, sched.stall_timeout_s, on_beat=log_filter.flush)

    def _batch_handler(self, args: dict[str, str], gpu: bool) -> DetectionBatchHandler | DeviceBatchHandler:
        """Metrics, the memory returner, and the batch handler (device or host) whose per-batch hook runs both."""
        sched = self.scheduler_config
        self.pool_metrics = pool_metrics(self._pb, args, [self.pool], sched, MODEL_NAME)
        self.metrics = scheduler_metrics(self._pb, args, sched, MODEL_NAME, self.batch_sizes)
        self.metrics_flusher, on_metrics = metrics_flusher(sched, self.metrics, self.pool_metrics,
                                                           args.get("model_instance_name", MODEL_NAME))
        self.memory = MemoryReturner([self.pool], keep_idle_bytes=self.config.staging_keep_idle_bytes,
                                     trim_growth_bytes=self.config.heap_trim_growth_bytes)
        on_batch = functools.partial(_after_batch, self.memory, on_metrics)
        if gpu:
            return DeviceBatchHandler(self.detector, self.pool, on_batch=on_batch, post_threads=self.config.post_threads)
        return DetectionBatchHandler(self.detector, self.pool, on_batch=on_batch)

    def bucket_of(self, shape_hw: tuple[int, int]) -> tuple[int, int]:
        """The queue key of a resized shape: its shape bucket, or the shape itself when the padded
        bucket would exceed ``max_resized_pixels`` (the staging check's bound) or there are no buckets."""
        bucket = self.buckets.snap(shape_hw)
        return bucket if bucket[0] * bucket[1] <= self.config.max_resized_pixels else tuple(shape_hw)

    def _prepare(self, image: np.ndarray) -> PreparedImage:
        """Resize for the network; an image kept at its size is copied out of the request's tensor memory,
        which the queue must not hold on to after ``execute`` returns."""
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
            try:  # a full queue answers 503 before the images are decoded, not 5-20 s late after them
                self.runner.check_room(self._image_count(request))
            except Exception as exc:
                replies.answer(index, error_response(pb, exc))
                continue
            try:
                values, name = self._input_values(request)
                options = (priority_level(request, self.scheduler_config), request_timeout_s(request, self.scheduler_config),
                           requested_outputs(request), request.is_cancelled, request.request_id() or "request")
            except Exception as exc:  # a bad request fails alone
                self.metrics.invalid_request()
                replies.answer(index, error_response(pb, exc))
                continue
            if self.decoders is None:
                self._accept(replies, index, values, name, options, arrival_s)
            else:  # the request's tensors are copies by now: the decode thread may outlive execute()
                self.decoders.submit(self._accept, replies, index, values, name, options, arrival_s)
        return None

    def _input_values(self, request: Any) -> tuple[np.ndarray, str]:
        """The request's one image input as a numpy array it owns (not a view of the request's memory), and its name."""
        present = [name for name in (ARRAY_INPUT, BYTES_INPUT) if self._pb.get_input_tensor_by_name(request, name) is not None]
        if len(present) != 1:
            raise InvalidInputError(f"send exactly one of the inputs {ARRAY_INPUT} (UINT8 [N, H, W, C]) or {BYTES_INPUT} "
                                    f"(BYTES [N], PNG/JPEG files); the request has {present or 'neither'}")
        values = read_input(self._pb, request, present[0])
        if present[0] == ARRAY_INPUT and self.decoders is not None:
            values = np.array(values, copy=True)
        return values, present[0]

    def _accept(self, replies: Replies, index: int, values: np.ndarray, name: str, options: tuple, arrival_s: float) -> None:
        """Decode, check and resize request ``index``'s images and queue them; a failure is the request's answer."""
        pb = self._pb
        level, timeout_s, wanted, is_cancelled, label = options
        try:
            prepared = [self._prepare(image) for image in self._decode(values, name)]
        except Exception as exc:  # a bad request fails alone
            self.metrics.invalid_request()
            replies.answer(index, error_response(pb, exc))
            return
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

    def _decode(self, values: np.ndarray, name: str) -> list[np.ndarray]:
        config = self.config
        limits = {"max_image_pixels": config.max_image_pixels, "max_request_pixels": config.max_request_pixels,
                  "max_images": config.max_images_per_request}
        if name == ARRAY_INPUT:
            return images_from_array(values, **limits)
        return images_from_bytes(values, **limits)

    def _image_count(self, request: Any) -> int:
        """Images in the request by its input's batch dimension, without decoding (0 if malformed: _input_values says why)."""
        counts = [rows for rows in (input_rows(self._pb, request, name) for name in (ARRAY_INPUT, BYTES_INPUT))
                  if rows is not None]
        return counts[0] if len(counts) == 1 else 0

    def _answer(self, replies: Replies, index: int, wanted: frozenset[str], ticket: Ticket, detections: list[Any] | None,
                error: BaseException | None) -> None:
        """The ticket's single answer: the request's detections as one ragged result (requested outputs only), or its error."""
        pb = self._pb
        if error is not None:
            replies.answer(index, error_response(pb, error))
            return
        boxes, scores, counts = concatenate(detections)
        replies.answer(index, select_outputs(pb, [
            pb.Tensor("BOXES", boxes), pb.Tensor("SCORES", scores), pb.Tensor("BOX_COUNTS", counts)], wanted))

    def finalize(self) -> None:
        """Finish decoding accepted requests, drain the scheduler (every accepted request gets its response),
        then release leases, pool and engine."""
        decoders = getattr(self, "decoders", None)
        if decoders is not None:
            decoders.shutdown(wait=True)
        stats = getattr(getattr(getattr(self, "detector", None), "engine", None), "stats", None)
        if stats is not None:
            LOG.info("text_detection engine on %s: %s", self.device, stats())
        close_scheduled(self)
        detector = getattr(self, "detector", None)
        if detector is not None:
            detector.close()
