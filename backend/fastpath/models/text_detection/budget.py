"""Memory budget of a text_detection model instance: its stub's peak above the idle stub, from the config.

A request of n images of h x w pixels (c channels), each resized to p pixels, runs in k engine calls of r rows
(set by the batch buckets). :func:`predict_peak` sums its terms, in bytes: ``request`` (the tensor in Triton's
shared memory), ``converted`` (RGB copies), ``resized`` (the queued uint8 copies), ``staging`` (the running
call's block and the next one's), ``engine`` (ONNX Runtime's working memory: E bytes per input pixel without
the arena, A with it, measured properties of the artifact), ``maps`` (the previous call's probability maps)
and ``postprocess``. :func:`peak_budget` adds up each term's bound over every request the caps accept, and
:func:`steady_budget` bounds what stays once a request was answered. The budget is a CPU instance's (on a GPU
the engine's working memory is device memory); with shape buckets (``bucket_sides_px``) pass the bucket's size
as ``resized_pixels``. Each term's formula and the measurements: docs/design/text_detection.md#budget.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from fastpath.graphs.buckets import Sizes
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.image import CONVERT_CHUNK_PIXELS
from fastpath.models.text_detection.preprocess import resized_shape

ENGINE_BYTES_PER_PIXEL = 146  # E: ORT session without the arena, peak working memory per input pixel of a call
ARENA_BYTES_PER_PIXEL = 200  # A: ORT arena without the memory pattern, bytes it grows to per pixel of a call
POSTPROCESS_BYTES_PER_PIXEL = 4  # DB post-processing of one map: binary map, dilation, contours
CONVERT_SCRATCH_BYTES_PER_PIXEL = 48  # 16-bit scaling and alpha compositing, per pixel of one chunk
ENCODED_COPIES = 3  # IMAGE_BYTES: Triton's shared memory, the Python bytes, one file without its colour profile
FLOAT32_BYTES = 4
RGB_CHANNELS = 3
MAX_CHANNELS = 4
MAX_BYTES_PER_SAMPLE = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestShape:
    """One request, as far as memory is concerned.

    Attributes:
        images: n, images in the request.
        height, width: pixels of each image (of the largest, for files of several sizes).
        channels: c, 1..4 (gray, gray+alpha, RGB, RGBA).
        encoded_bytes: None for an ``IMAGE`` tensor; for ``IMAGE_BYTES`` the total size of the files.
        bytes_per_sample: s: 1, or 2 for 16-bit PNG files.
        resized_pixels: p; None: ``resized_shape`` of (height, width) under the config.
    """

    images: int
    height: int
    width: int
    channels: int = RGB_CHANNELS
    encoded_bytes: int | None = None
    bytes_per_sample: int = 1
    resized_pixels: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """Bytes above the idle stub, by term (module docstring); ``arena_bytes``: what the CPU arena may
    keep from earlier calls (0 for a request arriving at the idle stub)."""

    request_bytes: int
    converted_bytes: int
    resized_bytes: int
    staging_bytes: int
    engine_bytes: int
    maps_bytes: int
    postprocess_bytes: int
    arena_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """The peak above the idle stub."""
        return sum(dataclasses.asdict(self).values())


def call_rows(images: int, batch_sizes: Sequence[int]) -> int:
    """Rows of the largest engine call for ``images`` queued images of one shape (filler rows included)."""
    return Sizes(sorted(batch_sizes), name="batch_sizes").up_or_largest(images)


def feed_size(rows: int, resized_pixels: int) -> int:
    """Bytes of one call's float32 input [rows, 3, h, w]."""
    return rows * RGB_CHANNELS * resized_pixels * FLOAT32_BYTES


def staged_blocks(config: TextDetectionConfig, calls: int, feed_bytes: int) -> int:
    """Staging blocks in use at once: the running call's and the next one's, as far as the pool holds them."""
    block = 1 << (feed_bytes - 1).bit_length()
    return max(1, min(calls, 2, config.staging_capacity_bytes // block))  # the model refuses to load without one


def engine_bytes(config: TextDetectionConfig, rows: int, resized_pixels: int) -> int:
    """ONNX Runtime's working memory for one call: E or A bytes per input pixel (module docstring)."""
    per_pixel = ENGINE_BYTES_PER_PIXEL if feed_size(rows, resized_pixels) > config.arena_max_input_bytes else ARENA_BYTES_PER_PIXEL
    return per_pixel * rows * resized_pixels


def arena_bytes(config: TextDetectionConfig) -> int:
    """Most the CPU arena keeps after calls of at most ``arena_max_input_bytes``: A bytes per input pixel."""
    return ARENA_BYTES_PER_PIXEL * config.arena_max_input_bytes // (RGB_CHANNELS * FLOAT32_BYTES)


def _resized_pixels(config: TextDetectionConfig, request: RequestShape) -> int:
    if request.resized_pixels is not None:
        return request.resized_pixels
    return math.prod(resized_shape(request.height, request.width, config.limit_side_len_px, config.limit_type,
                                   config.max_resized_pixels))


def _shared_bytes(request: RequestShape) -> int:
    """What Triton's python-backend shared memory holds of the request: its tensor, or its files."""
    if request.encoded_bytes is not None:
        return request.encoded_bytes
    return request.images * request.height * request.width * request.channels * request.bytes_per_sample


def _request_copies(config: TextDetectionConfig, request: RequestShape) -> int:
    """How many times the stub holds the request's shared-memory bytes: files 3x; a tensor once, or twice
    when decode threads take a copy of it (``decode_threads`` > 0)."""
    if request.encoded_bytes is not None:
        return ENCODED_COPIES
    return 2 if config.decode_threads else 1


def _converted_bytes(request: RequestShape) -> int:
    pixels = request.height * request.width
    encoded = request.encoded_bytes is not None
    if not encoded and request.channels == RGB_CHANNELS:
        return 0  # the RGB tensor itself is used, no copy
    samples = pixels * request.channels
    decoded = samples * request.bytes_per_sample + (samples if request.bytes_per_sample > 1 else 0) if encoded else 0
    scratch = request.channels in (2, 4) or request.bytes_per_sample > 1
    return request.images * pixels * RGB_CHANNELS + decoded + (
        min(pixels, CONVERT_CHUNK_PIXELS) * CONVERT_SCRATCH_BYTES_PER_PIXEL if scratch else 0)


def predict_peak(config: TextDetectionConfig, batch_sizes: Sequence[int], request: RequestShape) -> MemoryBudget:
    """The stub's peak above its idle size while it serves ``request`` alone.

    Args:
        config: the model's parameters.
        batch_sizes: the scheduler's engine batch sizes (``SchedulerConfig.batch_sizes``).
        request: what the request carries.
    """
    pixels = _resized_pixels(config, request)
    rows = call_rows(request.images, batch_sizes)
    calls = math.ceil(request.images / max(batch_sizes))
    feed = feed_size(rows, pixels)
    return MemoryBudget(
        request_bytes=_shared_bytes(request) * _request_copies(config, request),
        converted_bytes=_converted_bytes(request),
        resized_bytes=request.images * pixels * RGB_CHANNELS,
        staging_bytes=staged_blocks(config, calls, feed) * feed,
        engine_bytes=engine_bytes(config, rows, pixels),
        maps_bytes=rows * pixels * FLOAT32_BYTES if calls > 1 else 0,
        postprocess_bytes=POSTPROCESS_BYTES_PER_PIXEL * pixels,
    )


def peak_budget(config: TextDetectionConfig, batch_sizes: Sequence[int]) -> MemoryBudget:
    """Per term, the most any legal request reaches, plus :func:`arena_bytes`: the total bounds the stub's
    peak above its idle size for every request the caps accept (IMAGE_BYTES files taken no larger than
    their samples).

    With N = ``max_images_per_request``, R = min(``max_request_pixels``, N * ``max_image_pixels``),
    I = min(``max_image_pixels``, R), P = ``largest_resized_pixels``, B the largest bucket, F = B * 3 * P * 4:
    request 3 * 8 * R (16-bit RGBA files), converted 3 * R + 12 * I + one chunk's scratch, resized
    3 * N * P, staging min(2, blocks) * F, engine max(E * B * P, A * min(B * P, arena_max_input_bytes / 12)),
    maps 4 * B * P, postprocess 4 * P.
    """
    images = config.max_images_per_request
    request_pixels = min(config.max_request_pixels, images * config.max_image_pixels)
    image_pixels = min(config.max_image_pixels, request_pixels)
    pixels, rows = config.largest_resized_pixels, max(batch_sizes)
    feed = feed_size(rows, pixels)
    samples = MAX_CHANNELS * MAX_BYTES_PER_SAMPLE
    arena_rows_pixels = min(rows * pixels, config.arena_max_input_bytes // (RGB_CHANNELS * FLOAT32_BYTES))
    return MemoryBudget(
        request_bytes=ENCODED_COPIES * samples * request_pixels,
        converted_bytes=(RGB_CHANNELS * request_pixels + (samples + MAX_CHANNELS) * image_pixels
                         + min(image_pixels, CONVERT_CHUNK_PIXELS) * CONVERT_SCRATCH_BYTES_PER_PIXEL),
        resized_bytes=images * pixels * RGB_CHANNELS,
        staging_bytes=staged_blocks(config, 2, feed) * feed,
        engine_bytes=max(ENGINE_BYTES_PER_PIXEL * rows * pixels, ARENA_BYTES_PER_PIXEL * arena_rows_pixels),
        maps_bytes=rows * pixels * FLOAT32_BYTES,
        postprocess_bytes=POSTPROCESS_BYTES_PER_PIXEL * pixels,
        arena_bytes=arena_bytes(config),
    )


def steady_budget(config: TextDetectionConfig, batch_sizes: Sequence[int], request: RequestShape) -> int:
    """Bytes above the idle stub that may stay once ``request`` (the largest one served) was answered.

    Triton's python-backend shared memory keeps the largest request mapped; the staging pool keeps
    ``staging_keep_idle_bytes``; the last call's resized copies and maps are freed after the trim
    that followed it; later batches may grow the C heap by up to ``heap_trim_growth_bytes`` before
    the next trim; the arena keeps what calls of at most ``arena_max_input_bytes`` needed.
    """
    last_call = call_rows(request.images, batch_sizes) * _resized_pixels(config, request) * (RGB_CHANNELS + FLOAT32_BYTES)
    return (_shared_bytes(request) + config.staging_keep_idle_bytes + last_call + config.heap_trim_growth_bytes
            + arena_bytes(config))
