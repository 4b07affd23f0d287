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

    Attributes:
        runtime: engine runtime, one of ``RUNTIMES``; ``onnxruntime`` (CPU execution provider) is
            the default that runs everywhere.
        precision: ``fp32`` | ``fp16`` | ``int8`` | ``fp8``; selects the artifact of that precision.
        device: ``cpu`` or ``cuda`` / ``cuda:N`` (torch runtime; onnxruntime runs on the CPU). A
            ``KIND_GPU`` instance runs on the GPU Triton assigned it whatever this says
            (:func:`placed_config`); leave it unset there.
        artifact: ONNX file name inside the model version directory.
        tokenizer: tokenizer file name inside the model version directory (HF ``tokenizer.json``).
        intra_op_threads: ONNX Runtime intra-op threads; 0: one per CPU the process may use (ONNX Runtime's
            own default when that is the whole machine; the affinity mask or cgroup CPU quota otherwise:
            :func:`fastpath.engines.cpus.ort_intra_op_threads`).
        intra_op_spinning: ONNX Runtime's ``session.intra_op.allow_spinning``: its worker threads
            busy-wait between operators (true, ONNX Runtime's default) or sleep (false).
        max_seq_length: truncation length in tokens, [CLS] and [SEP] included. 256 is
            all-MiniLM-L6-v2's ``max_seq_length`` (sentence_bert_config.json).
        max_text_bytes: largest accepted UTF-8 size of one text, in bytes; larger texts get a 400
            before tokenization.
        max_batch_texts: most texts the engine runs in one call.
        length_buckets_tokens: padded sequence lengths; a batch pads to the smallest bucket that
            holds its longest member, never beyond ``max_seq_length``.
        cuda_sync: torch runtime on CUDA: how an instance waits for its batch. ``spin`` (busy-wait,
            the default: faster on the H200, docs/benchmarks/triton_gpu_h200.md) or ``blocking`` (the thread sleeps on a
            ``cudaEventBlockingSync`` event, leaving its core free; for hosts short of cores).
        concurrent_batches: ONNX Runtime on the CPU: batches one instance runs at once, each on
            its own engine lane (an ONNX Runtime session of ``intra_op_threads`` / lanes threads;
            all-MiniLM-L6-v2 fp32 holds ~90 MB of weights per lane), all fed from the instance's
            one queue; a batch that runs alone still gets every thread (the main session). 0
            (default) = 2 when the process may use 2 or more cores, else 1. Measured on the 2-core
            dev machine at concurrency 32: two one-thread lanes served ~1.3x the throughput of one
            two-thread session, because an operator of a multi-threaded session waits at its
            barrier for a thread the OS gave to Triton, the client or the stub, and three lanes did
            worse than two (docs/benchmarks/scheduler_cpu.md). Other runtimes: 0 or 1 (scale
            them with the instance_group count).
        tokenizer_parallelism: let HF tokenizers spread one ``execute()``'s texts over its Rayon
            thread pool (one thread per core, in every instance's process). Off by default: each
            Triton instance is already its own process, and the pool's threads cost CPU that the
            engine, Triton and the other instances need. Measured on a 2-core machine, 24 texts
            per call: parallel 34 us/text wall but 64 us/text CPU, sequential 50 us/text both. On
            the H200 host (16 cores, 6 instances): off served 15.5k one-text requests/s at
            c=256 against 13.7k with it on (stub CPU 295 vs 413 us/request), while bulk requests of
            32 texts at c=32, with cores to spare, ran 35k texts/s off against 44k on.
        tokenizer_threads: with ``tokenizer_parallelism``, the size of each instance's Rayon pool
            (0: one thread per core, Rayon's default; the environment's ``RAYON_NUM_THREADS`` wins).
        tokenizer_parallel_min_texts: with ``tokenizer_parallelism``, an ``execute()`` call of
            fewer texts tokenizes on its own thread: handing a few texts to the pool costs more than
            it saves. The GPU configuration uses 32 with 4 threads: on the H200 host (6 instances,
            perf_analyzer) the pool served 32-text requests 1.77x faster and one-text requests at
            c=256 (calls of ~40 texts) 1.10x, but calls of ~10 texts at c=64 0.95x and c=1 0.12 ms
            slower (docs/benchmarks/served_gpu_h200.md).
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
            it with ``dynamic_batching`` at 0 us and several instances).
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
