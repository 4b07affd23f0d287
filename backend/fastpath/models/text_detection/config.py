"""Parameters of the text-detection model (``model_repository/text_detection/config.pbtxt``).

Built with :func:`fastpath.config.parse_parameters`, like ``TextEmbeddingConfig``: every value
arrives as a string, unknown keys are an error that names the key.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fastpath.config import PRECISIONS, RUNTIMES, check_parameter
from fastpath.scheduling.config import SchedulerConfig
from fastpath.workers import ORDERS

NETWORK_STRIDE_PX = 32  # DB's backbone downsamples by 32: each resized side is a multiple of this
LIMIT_TYPES = ("max", "min")  # PaddleOCR DetResizeForTest limit_type: cap the longer side / raise the shorter side
DEFAULT_MAX_RESIZED_PIXELS = 2048 * 1024  # resized h * w cap: 24 MiB of float32 input per image
DECODE_DEVICES = ("cpu", "cuda")  # where JPEG files of IMAGE_BYTES are decoded and resized (cuda: nvJPEG, GPU instances)
UINT8_ARTIFACT = "model.uint8.onnx"  # the GPU engine's artifact: uint8 RGB input, normalized in the graph
MIB = 1 << 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextDetectionConfig:
    """Parameters of a FastPath text-detection model (PP-OCRv4 det + DB post-processing).

    Each field is a ``config.pbtxt`` parameter of the same name, its unit in its name (``_px``,
    ``_bytes``, ``_s``); meanings and defaults are in the knobs table of docs/design/text_detection.md.
    Defaults are PaddleOCR's ``det_limit_type="max"`` / ``det_limit_side_len=960`` resize and the DB
    post-processing values of rapidocr-onnxruntime 1.4.4's ``config.yaml`` (``Det`` section). The
    staging pool must hold the largest batch (``batch_buckets[-1]`` images of
    :attr:`largest_resized_pixels` as float32); the memory terms bound the stub's peak
    (:mod:`fastpath.models.text_detection.budget`).

    Raises:
        ConfigError: a value out of range, naming the parameter, the value and the expectation.
    """

    runtime: str = "onnxruntime"
    precision: str = "fp32"
    artifact: str = "model.onnx"
    gpu_artifact: str = UINT8_ARTIFACT
    intra_op_threads: int = 0
    limit_type: str = "max"
    limit_side_len_px: int = 960
    max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS
    max_image_pixels: int = 8192 * 8192
    max_request_pixels: int = 8192 * 8192
    max_images_per_request: int = 16
    max_batch_images: int = 8
    binary_threshold: float = 0.3
    box_threshold: float = 0.5
    unclip_ratio: float = 1.6
    max_candidates: int = 1000
    use_dilation: bool = True
    min_box_side_px: int = 3
    staging_capacity_bytes: int = 512 << 20
    staging_wait_timeout_s: float = 1.0
    bucket_sides_px: tuple[int, ...] = ()
    max_cuda_graphs: int = 64
    cuda_graph_after_runs: int = 0
    cuda_tf32: bool = False
    cuda_graph_session_per_shape: bool = False
    cuda_eager_session_per_shape: bool = False
    cuda_eager_options: tuple[str, ...] = ()
    cuda_intra_op_threads: int = 1
    cuda_blocking_sync: bool = False
    opencv_threads: int = 0
    decode_threads: int = 0
    decode_device: str = "cpu"
    post_threads: int = 0
    thread_pool_order: str = "fifo"
    capture_shapes_px: tuple[str, ...] = ()
    arena_max_input_bytes: int = 32 * MIB
    staging_keep_idle_bytes: int = 64 * MIB
    heap_trim_growth_bytes: int = 64 * MIB

    def __post_init__(self) -> None:
        check_parameter(self.runtime in RUNTIMES, "runtime", self.runtime, f"one of {', '.join(RUNTIMES)}")
        check_parameter(self.precision in PRECISIONS, "precision", self.precision, f"one of {', '.join(PRECISIONS)}")
        check_parameter(self.intra_op_threads >= 0, "intra_op_threads", self.intra_op_threads, ">= 0")
        check_parameter(self.gpu_artifact.endswith(".onnx") and "/" not in self.gpu_artifact and "\\" not in self.gpu_artifact,
                        "gpu_artifact", self.gpu_artifact, "a file name in the version directory ending in .onnx, uint8 "
                        f"[batch, height, width, 3] in (the default {UINT8_ARTIFACT} or a fastpath.artifacts.detection_fp16 candidate)")
        check_parameter(
            self.limit_side_len_px >= NETWORK_STRIDE_PX and self.limit_side_len_px % NETWORK_STRIDE_PX == 0,
            "limit_side_len_px",
            self.limit_side_len_px,
            f"a multiple of {NETWORK_STRIDE_PX}, at least {NETWORK_STRIDE_PX}",
        )
        check_parameter(self.limit_type in LIMIT_TYPES, "limit_type", self.limit_type, f"one of {', '.join(LIMIT_TYPES)}")
        check_parameter(self.max_resized_pixels >= NETWORK_STRIDE_PX**2, "max_resized_pixels", self.max_resized_pixels,
                        f">= {NETWORK_STRIDE_PX**2} (one 32x32 input); the default is {DEFAULT_MAX_RESIZED_PIXELS}")
        check_parameter(self.max_image_pixels > 0, "max_image_pixels", self.max_image_pixels, "> 0")
        check_parameter(self.max_request_pixels > 0, "max_request_pixels", self.max_request_pixels, "> 0")
        check_parameter(self.max_images_per_request > 0, "max_images_per_request", self.max_images_per_request, "> 0")
        check_parameter(self.max_batch_images > 0, "max_batch_images", self.max_batch_images, "> 0")
        check_parameter(0.0 < self.binary_threshold < 1.0, "binary_threshold", self.binary_threshold, "in (0, 1)")
        check_parameter(0.0 <= self.box_threshold < 1.0, "box_threshold", self.box_threshold, "in [0, 1)")
        check_parameter(self.unclip_ratio > 0.0, "unclip_ratio", self.unclip_ratio, "> 0")
        check_parameter(self.max_candidates > 0, "max_candidates", self.max_candidates, "> 0")
        check_parameter(self.min_box_side_px >= 0, "min_box_side_px", self.min_box_side_px, ">= 0")
        check_parameter(self.staging_capacity_bytes >= 4096, "staging_capacity_bytes", self.staging_capacity_bytes,
                        ">= 4096 (one page); the default is 536870912 (512 MiB)")
        check_parameter(self.staging_wait_timeout_s >= 0, "staging_wait_timeout_s", self.staging_wait_timeout_s, ">= 0 seconds")
        check_parameter(all(side >= NETWORK_STRIDE_PX and side % NETWORK_STRIDE_PX == 0 for side in self.bucket_sides_px),
                        "bucket_sides_px", ",".join(map(str, self.bucket_sides_px)), f"positive multiples of {NETWORK_STRIDE_PX}")
        check_parameter(self.max_cuda_graphs >= 0, "max_cuda_graphs", self.max_cuda_graphs, ">= 0")
        check_parameter(self.cuda_graph_after_runs >= 0, "cuda_graph_after_runs", self.cuda_graph_after_runs, ">= 0 (0: never)")
        check_parameter(0 <= self.cuda_intra_op_threads <= 64, "cuda_intra_op_threads", self.cuda_intra_op_threads,
                        "in 0..64 (1: the calling thread alone; 0: one per CPU)")
        check_parameter(0 <= self.opencv_threads <= 64, "opencv_threads", self.opencv_threads,
                        "in 0..64 (1: each OpenCV call on its calling thread; 0: OpenCV's default pool, one thread per CPU)")
        check_parameter(0 <= self.decode_threads <= 64, "decode_threads", self.decode_threads, "in 0..64")
        check_parameter(self.decode_device in DECODE_DEVICES, "decode_device", self.decode_device,
                        f"one of {', '.join(DECODE_DEVICES)} (cuda: nvJPEG on a KIND_GPU instance)")
        check_parameter(0 <= self.post_threads <= 64, "post_threads", self.post_threads, "in 0..64")
        check_parameter(self.thread_pool_order in ORDERS, "thread_pool_order", self.thread_pool_order,
                        f"one of {', '.join(ORDERS)} (which idle decode or post thread takes the next task: the one idle "
                        "longest, or the one idle last)")
        for text in self.capture_shapes_px:
            parts = text.lower().split("x")
            check_parameter(len(parts) == 2 and all(p.isdigit() and int(p) % NETWORK_STRIDE_PX == 0 and int(p) > 0 for p in parts),
                            "capture_shapes_px", text, f"HxW with H and W positive multiples of {NETWORK_STRIDE_PX}, e.g. 736x1312")
        for text in self.cuda_eager_options:
            name, sep, value = text.partition("=")
            check_parameter(bool(sep and name and value), "cuda_eager_options", text,
                            "name=value pairs of ONNX Runtime CUDA EP options, e.g. arena_extend_strategy=kSameAsRequested")
        check_parameter(self.arena_max_input_bytes >= 0, "arena_max_input_bytes", self.arena_max_input_bytes,
                        ">= 0 bytes (0: no call uses the arena)")
        check_parameter(self.staging_keep_idle_bytes >= 0, "staging_keep_idle_bytes", self.staging_keep_idle_bytes, ">= 0 bytes")
        check_parameter(self.heap_trim_growth_bytes >= 1, "heap_trim_growth_bytes", self.heap_trim_growth_bytes, ">= 1 byte")

    @property
    def capture_shapes_hw(self) -> tuple[tuple[int, int], ...]:
        """:attr:`capture_shapes_px` as (height, width) pairs."""
        return tuple(tuple(int(p) for p in text.lower().split("x")) for text in self.capture_shapes_px)  # type: ignore[misc]

    @property
    def largest_resized_pixels(self) -> int:
        """Most height * width a resized image can have: ``limit_side_len_px``^2 under ``max``, capped
        by ``max_resized_pixels``; ``max_resized_pixels`` under ``min``."""
        if self.limit_type == "max":
            return min(self.limit_side_len_px**2, self.max_resized_pixels)
        return self.max_resized_pixels

    def cpu_engine_options(self) -> dict[str, object]:
        """``load_engine`` options of the CPU engine: threads, and calls above ``arena_max_input_bytes``
        without the arena. ONNX Runtime's memory pattern is off: with this model's dynamic shapes it
        made the arena keep a second copy of each shape's tensors, and calls ran 2-6% faster without it."""
        return {"intra_op_threads": self.intra_op_threads, "memory_pattern": False,
                "arena_max_input_bytes": self.arena_max_input_bytes}

    def gpu_engine_options(self) -> dict[str, object]:
        """``load_engine`` options of the GPU engine (``layout="images"``): its CUDA graphs, TF32, sessions and their CPU threads."""
        return {"max_graphs": self.max_cuda_graphs, "graph_after_runs": self.cuda_graph_after_runs, "tf32": self.cuda_tf32,
                "session_per_graph": self.cuda_graph_session_per_shape, "eager_session_per_shape": self.cuda_eager_session_per_shape,
                "cuda_intra_op_threads": self.cuda_intra_op_threads, "eager_options": self.cuda_eager_option_map}

    @property
    def cuda_eager_option_map(self) -> dict[str, str]:
        """:attr:`cuda_eager_options` as ONNX Runtime CUDA EP options (name to string value) of the graph-free sessions."""
        return dict(text.partition("=")[::2] for text in self.cuda_eager_options)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectionSchedulerConfig(SchedulerConfig):
    """:class:`~fastpath.scheduling.config.SchedulerConfig` of ``text_detection``, in images.

    A batch holds images of one resized shape (never padded across shapes) and ``batch_buckets``
    are the engine's batch sizes in images. Defaults: batches of 1, 2, 4 or 8 images (8 x 960x960
    is 88 MB of float32 input), no wait for company beyond 2 ms (a CPU detector call costs tens to
    hundreds of milliseconds, so waiting rarely pays), and every request asked whether it was
    cancelled (``cancel_check_after_us`` 0: the ask's ~0.5 ms of CPU is small next to an image's
    engine work, which a cancelled request would waste).

    Attributes:
        max_queue_images: queue bound in images (each holds its resized uint8 copy, at most
            ``max_resized_pixels`` x 3 bytes); a request that does not fit is answered UNAVAILABLE.
    """

    batch_buckets: tuple[int, ...] = (1, 2, 4, 8)
    max_queue_images: int = 64
    cancel_check_after_us: int = 0

    QUEUE_BOUND: ClassVar[str] = "max_queue_images"
