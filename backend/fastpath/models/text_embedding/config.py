"""Typed ``config.pbtxt`` parameters of ``text_embedding``: engine, tokenizer and limits; its scheduler's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from fastpath.config import PRECISIONS, RUNTIMES, check_parameter, instance_device, triton_parameters
from fastpath.scheduling.config import SchedulerConfig

# runtimes text_embedding runs on a GPU (the torch engine with CUDA graphs); onnxruntime here is the CPU engine
GPU_RUNTIMES = ("torch",)
RESPONSE_MODES = ("sender", "return")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextEmbeddingConfig:
    """Parameters of a FastPath text-embedding model (``config.pbtxt`` ``parameters``).

    Each field is a parameter of the same name, its unit in its name; meanings, defaults and the
    measurements behind them are in docs/models.md (the ``text_embedding`` parameter table). A
    ``KIND_GPU`` instance runs on the GPU Triton assigned it whatever ``device`` says
    (:func:`placed_config`). ``concurrent_batches`` 0 means 2 engine lanes when the process may use
    2 or more cores, else 1 (:func:`fastpath.engines.cpus.ort_intra_op_threads` counts them).

    Raises:
        ConfigError: a value out of range, naming the parameter, the value and the expectation.
    """

    runtime: str = "onnxruntime"
    precision: str = "fp32"
    device: str = "cpu"
    artifact: str = "model.onnx"
    tokenizer: str = "tokenizer.json"
    intra_op_threads: int = 0
    intra_op_spinning: bool = True
    max_seq_length: int = 256
    max_text_bytes: int = 1 << 20
    max_batch_texts: int = 64
    length_buckets_tokens: tuple[int, ...] = (16, 32, 64, 128, 256)
    cuda_sync: str = "spin"
    tokenizer_parallelism: bool = False
    tokenizer_threads: int = 0
    tokenizer_parallel_min_texts: int = 1
    concurrent_batches: int = 0

    def __post_init__(self) -> None:
        check_parameter(self.runtime in RUNTIMES, "runtime", self.runtime, f"one of {', '.join(RUNTIMES)}")
        check_parameter(self.precision in PRECISIONS, "precision", self.precision, f"one of {', '.join(PRECISIONS)}")
        check_parameter(self.device == "cpu" or self.device.startswith("cuda"), "device", self.device, "cpu, cuda or cuda:N")
        check_parameter(self.intra_op_threads >= 0, "intra_op_threads", self.intra_op_threads, ">= 0")
        check_parameter(self.cuda_sync in ("blocking", "spin"), "cuda_sync", self.cuda_sync, "blocking or spin")
        check_parameter(self.tokenizer_parallel_min_texts >= 1, "tokenizer_parallel_min_texts", self.tokenizer_parallel_min_texts, ">= 1")
        check_parameter(self.tokenizer_threads >= 0, "tokenizer_threads", self.tokenizer_threads, ">= 0 (0 = one per core)")
        check_parameter(self.concurrent_batches >= 0, "concurrent_batches", self.concurrent_batches, ">= 0 (0 = auto)")
        check_parameter(self.concurrent_batches <= 1 or (self.runtime == "onnxruntime" and self.device == "cpu"),
                        "concurrent_batches", self.concurrent_batches,
                        "0 or 1 unless runtime is onnxruntime on the cpu (other runtimes scale with instance_group count)")
        check_parameter(2 <= self.max_seq_length <= 512, "max_seq_length", self.max_seq_length, "2..512 (BERT positions)")
        check_parameter(self.max_text_bytes > 0, "max_text_bytes", self.max_text_bytes, "> 0")
        check_parameter(self.max_batch_texts > 0, "max_batch_texts", self.max_batch_texts, "> 0")
        buckets = self.length_buckets_tokens
        check_parameter(
            len(buckets) > 0 and list(buckets) == sorted(set(buckets)) and buckets[0] > 0,
            "length_buckets_tokens",
            buckets,
            "a non-empty, strictly increasing list of positive token counts",
        )


def placed_config(config: TextEmbeddingConfig, args: Mapping[str, str]) -> TextEmbeddingConfig:
    """``config`` with ``device`` set to where this Triton instance runs (:func:`fastpath.config.instance_device`):
    ``cuda:<model_instance_device_id>`` for a ``KIND_GPU`` instance, else the ``device`` parameter.

    Raises:
        ConfigError: a ``KIND_GPU`` instance with a runtime other than :data:`GPU_RUNTIMES`, or a
            ``device`` parameter naming another device than Triton assigned.
    """
    written = triton_parameters(args.get("model_config") or "{}").get("device")
    return dataclasses.replace(config, device=instance_device(args, written, runtime=config.runtime, gpu_runtimes=GPU_RUNTIMES))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingSchedulerConfig(SchedulerConfig):
    """:class:`~fastpath.scheduling.config.SchedulerConfig` of ``text_embedding``: its queue bound in
    texts and how ``execute()`` answers (docs/design/scheduler.md, "Knobs").

    Attributes:
        max_queue_texts: queue bound in texts; a request that does not fit is answered UNAVAILABLE.
        response_mode: ``sender`` (default): ``execute()`` returns at once and the scheduler answers
            each request through its response sender, so one instance batches across calls.
            ``return``: ``execute()`` runs its requests' batches and returns their responses (pair
            it with ``dynamic_batching`` and several instances; the GPU config waits 200 us).
        inline_when_idle: ``sender`` mode: a one-request ``execute()`` that finds the scheduler idle
            runs its batches itself; needs ``dynamic_batching`` in front, and only requests of at
            most half of ``max_batch_size`` texts run inline.
    """

    max_queue_texts: int = 1024
    response_mode: str = "sender"
    inline_when_idle: bool = True

    QUEUE_BOUND: ClassVar[str] = "max_queue_texts"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_parameter(self.response_mode in RESPONSE_MODES, "response_mode", self.response_mode,
                        f"one of {', '.join(RESPONSE_MODES)}")
