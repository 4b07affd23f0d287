"""Typed, validated model configuration built from ``config.pbtxt`` ``parameters``.

Triton hands a python-backend model its configuration as JSON (``args["model_config"]``); every
``parameters { key: ... value: { string_value: ... } }`` entry arrives as a string. FastPath parses
them into frozen, keyword-only dataclasses, converting each value by the field's annotation and
validating in ``__post_init__``. An unknown key is an error that names the key and lists the known
ones, so a typo never silently falls back to a default.

Reference: Triton ``model_config.proto`` (``ModelParameter``), python_backend ``examples/add_sub``.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from fastpath.errors import ConfigError

T = TypeVar("T")

RUNTIMES = ("onnxruntime", "torch", "tensorrt")
PRECISIONS = ("fp32", "fp16", "int8", "fp8")


def _convert(key: str, raw: str, annotation: Any) -> Any:
    """Convert one parameter string to the annotated type; raise ConfigError naming the key."""
    text = raw.strip()
    try:
        if annotation is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true/false")
        if annotation is int:
            return int(text)
        if annotation is float:
            return float(text)
        if annotation is str:
            return text
        if typing.get_origin(annotation) is tuple:
            (item_type, *_rest) = typing.get_args(annotation)
            return tuple(item_type(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError as exc:
        raise ConfigError(
            f"config.pbtxt parameter {key!r} = {raw!r} is not a valid {getattr(annotation, '__name__', annotation)}: {exc}"
        ) from None
    raise ConfigError(f"parameter {key!r} has an unsupported type {annotation!r}")  # programming error


def parse_parameters(cls: type[T], parameters: Mapping[str, str]) -> T:
    """Build the dataclass ``cls`` from string parameters.

    Args:
        cls: a dataclass whose fields all have defaults.
        parameters: key -> string value, e.g. from :func:`triton_parameters`.

    Returns:
        An instance of ``cls`` (validated by its ``__post_init__``).

    Raises:
        ConfigError: a key is unknown, or a value does not convert or validate.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(parameters) - fields)
    if unknown:
        raise ConfigError(
            f"unknown config.pbtxt parameter {unknown[0]!r} for {cls.__name__}; "
            f"known parameters: {', '.join(sorted(fields))}"
        )
    values = {key: _convert(key, value, hints[key]) for key, value in parameters.items()}
    return cls(**values)


def triton_parameters(model_config: Mapping[str, Any] | str) -> dict[str, str]:
    """Extract ``parameters`` from Triton's model config (dict or its JSON string).

    Triton writes each entry as ``{"key": {"string_value": "..."}}``.
    """
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    params = config.get("parameters") or {}
    return {key: str(value.get("string_value", "")) for key, value in params.items()}


def check_parameter(condition: bool, key: str, value: Any, expectation: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, ``value`` and the ``expectation`` unless ``condition``.

    Shared by every FastPath config dataclass's ``__post_init__`` (text and vision models, scheduler).
    """
    if not condition:
        raise ConfigError(f"config.pbtxt parameter {key!r} = {value!r}: expected {expectation}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextEmbeddingConfig:
    """Parameters of a FastPath text-embedding model (``config.pbtxt`` ``parameters``).

    Attributes:
        runtime: engine runtime, one of ``RUNTIMES``; ``onnxruntime`` (CPU execution provider) is
            the default that runs everywhere.
        precision: ``fp32`` | ``fp16`` | ``int8`` | ``fp8``; selects the artifact of that precision.
        device: ``cpu`` or ``cuda`` / ``cuda:N`` (torch runtime; onnxruntime runs on the CPU).
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
            before tokenization (../shared/cases K07).
        max_batch_texts: most texts the engine runs in one call.
        length_buckets_tokens: padded sequence lengths; a batch pads to the smallest bucket that
            holds its longest member, never beyond ``max_seq_length``.
        cuda_sync: torch runtime on CUDA: how an instance waits for its batch. ``spin`` (busy-wait,
            the default: faster on the H200, run 17) or ``blocking`` (the thread sleeps on a
            ``cudaEventBlockingSync`` event, leaving its core free; for hosts short of cores).
        concurrent_batches: ONNX Runtime on the CPU: batches one instance runs at once, each on
            its own engine lane (an ONNX Runtime session of ``intra_op_threads`` / lanes threads;
            all-MiniLM-L6-v2 fp32 holds ~90 MB of weights per lane), all fed from the instance's
            one queue; a batch that runs alone still gets every thread (the main session). 0
            (default) = 2 when the process may use 2 or more cores, else 1. Measured on the 2-core
            dev machine at concurrency 32: two one-thread lanes served ~1.3x the throughput of one
            two-thread session, because an operator of a multi-threaded session waits at its
            barrier for a thread the OS gave to Triton, the client or the stub, and three lanes did
            worse than two (docs/benchmarks/scheduler_cpu_runs.md). Other runtimes: 0 or 1 (scale
            them with the instance_group count).
        tokenizer_parallelism: let HF tokenizers spread one ``execute()``'s texts over its Rayon
            thread pool (one thread per core, in every instance's process). Off by default: each
            Triton instance is already its own process, and the pool's threads cost CPU that the
            engine, Triton and the other instances need. Measured on this 2-core machine, 24 texts
            per call: parallel 34 us/text wall but 64 us/text CPU, sequential 50 us/text both. On
            the H200 host (16 cores, 6 instances, run 17): off served 15.5k one-text requests/s at
            c=256 against 13.7k with it on (stub CPU 295 vs 413 us/request), while bulk requests of
            32 texts at c=32, with cores to spare, ran 35k texts/s off against 44k on.
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
    concurrent_batches: int = 0

    def __post_init__(self) -> None:
        check_parameter(self.runtime in RUNTIMES, "runtime", self.runtime, f"one of {', '.join(RUNTIMES)}")
        check_parameter(self.precision in PRECISIONS, "precision", self.precision, f"one of {', '.join(PRECISIONS)}")
        check_parameter(self.device == "cpu" or self.device.startswith("cuda"), "device", self.device, "cpu, cuda or cuda:N")
        check_parameter(self.intra_op_threads >= 0, "intra_op_threads", self.intra_op_threads, ">= 0")
        check_parameter(self.cuda_sync in ("blocking", "spin"), "cuda_sync", self.cuda_sync, "blocking or spin")
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


RESPONSE_MODES = ("sender", "return")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Parameters of FastPath's batch scheduler (``fastpath.scheduling``), from ``config.pbtxt``.

    The defaults work untuned: the scheduler learns each batch shape's cost online, runs a batch as
    soon as the engine is free unless waiting is predicted to pay, and never waits longer than
    ``max_queue_delay_us``. See docs/design/scheduler.md.

    Attributes:
        batch_buckets: batch sizes the engine runs (its CUDA-graph / optimization-profile sizes);
            a batch is cut or padded with filler rows to one of them. The largest is the most texts
            per engine call.
        max_queue_delay_us: the longest a text waits for a fuller batch while the engine is free
            (Triton ``dynamic_batching.max_queue_delay_microseconds``).
        max_queue_texts: queue bound in texts; a request that does not fit is rejected with
            UNAVAILABLE (HTTP 503, retryable), as Triton's ``max_queue_size`` does.
        default_timeout_us: queue timeout for requests that carry none; 0 = no timeout (Triton
            ``default_queue_policy.default_timeout_microseconds``). A request still queued at its
            timeout is answered UNAVAILABLE "Request timeout expired".
        priority_levels: number of priority levels, 1 = highest (Triton ``priority_levels``);
            0 disables priorities.
        default_priority_level: level of requests that send none (Triton ``default_priority_level``).
        cost_ewma_alpha: weight of the newest measurement in each batch shape's execution-time EWMA.
        min_padding_gain: a wider length range, filler rows, or waiting for more texts is chosen only
            if the cost model predicts at least this factor more efficiency (useful / engine time)
            than the padding-free choice. Higher trades throughput for less padding.
        deadline_margin_us: slack kept between a batch's predicted end and its earliest deadline.
        stage_lead_us: how long before the running batch's predicted end the next batch is formed
            and staged (padded) so it is ready when the engine frees up.
        drain_timeout_s: on unload, how long queued and running work may take before what is left
            is answered UNAVAILABLE.
        warmup: run a few batch shapes at load to warm the engine and seed the cost model.
        check_cancellation: skip (and answer CANCELLED) texts whose request was cancelled.
        cancel_check_after_us: ask a request whether it was cancelled only once it has waited this
            long in FastPath's queue when its batch forms; 0 = ask every request. In Triton 2.51's
            python backend each ``is_cancelled()`` is a stub-to-server round trip: ~0.5 ms of CPU
            per request at concurrency 32 on the 2-core dev machine, where a text's engine work is
            ~7 ms of CPU (docs/benchmarks/scheduler_cpu_runs.md, "Variants, CPU per request"). Asking
            every request pays only if more than ~7% of them are cancelled; clients cancel when
            their deadline passes, which happens after long waits, in overload, where every queued
            request has waited long and is asked. A request cancelled sooner still runs; Triton
            drops its answer. The default (250 ms) is above the queue waits of a loaded but healthy
            server (p99 latency 260-310 ms at concurrency 32 on the dev machine, engine time included).
        response_mode: how answers reach Triton. ``sender`` (default): ``execute()`` returns at once
            and each request is answered through its response sender as soon as its rows are
            ready, so one instance batches across ``execute()`` calls. ``return``: ``execute()``
            runs its requests' batches itself (same batch rules, no waiting for company, no
            scheduler threads) and returns their responses as its list, one stub round trip per
            call; pair it with ``dynamic_batching { max_queue_delay_microseconds: N }`` so Triton
            hands each call every request queued meanwhile, and several instances. Each
            response sent through a sender is its own synchronous stub-to-server round trip; on
            the H200 that capped ``sender`` at ~1.4k requests/s per instance (docs/benchmarks/triton_gpu.md).
        inline_when_idle: ``sender`` mode: an ``execute()`` call of one request that finds the
            scheduler idle (nothing queued, running or being delivered) runs its batches itself and
            returns its response, as ``return`` mode does; the scheduler threads take over again
            from the next call. Needs Triton's ``dynamic_batching`` (no delay: 0 us) in front, so
            a call of several requests reveals a backlog in Triton (those go to the scheduler's
            queue); only requests of at most half of ``max_batch_size`` texts run inline, since
            Triton cannot put two larger ones in one call and a backlog of them would look like
            lone requests (found in a fresh-user trial: bursts of 40- and 64-text requests were
            served one inline call at a time and never reached the bounded queue). Saves a lone request the thread hand-offs and the response sender's round
            trip (~0.9 ms of a ~6.8 ms request at concurrency 1 on the 2-core dev machine,
            docs/benchmarks/scheduler_cpu_runs.md). Requests Triton delivers meanwhile wait in
            Triton's queue for at most that one batch.
        metrics: publish the scheduler's and the staging pool's custom metrics. Each update is a
            stub-to-server round trip; on the H200 at ~12k requests/s, publishing them from the
            request path cost 18% throughput (runs 11 and 12, docs/benchmarks/triton_gpu.md).
        metrics_interval_ms: publish metrics from a background thread every this many
            milliseconds (and at unload) instead of on the request path; the request path only
            records into local buffers. A scrape may trail the last batches by this much. 0:
            publish each update on the request path as it happens.
    """

    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    max_queue_delay_us: int = 2000
    max_queue_texts: int = 1024
    default_timeout_us: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0
    cost_ewma_alpha: float = 0.2
    min_padding_gain: float = 1.1
    deadline_margin_us: int = 1000
    stage_lead_us: int = 1000
    drain_timeout_s: float = 30.0
    warmup: bool = True
    check_cancellation: bool = True
    cancel_check_after_us: int = 250_000
    response_mode: str = "sender"
    inline_when_idle: bool = True
    metrics: bool = True
    metrics_interval_ms: int = 500

    def __post_init__(self) -> None:
        buckets = self.batch_buckets
        check_parameter(self.metrics_interval_ms >= 0, "metrics_interval_ms", self.metrics_interval_ms,
                        ">= 0 (0 = publish on the request path)")
        check_parameter(self.response_mode in RESPONSE_MODES, "response_mode", self.response_mode,
                        f"one of {', '.join(RESPONSE_MODES)}")
        check_parameter(
            len(buckets) > 0 and list(buckets) == sorted(set(buckets)) and buckets[0] == 1,
            "batch_buckets",
            buckets,
            "a strictly increasing list of batch sizes starting at 1, e.g. 1,2,4,8,16,32,64",
        )
        check_parameter(self.max_queue_delay_us >= 0, "max_queue_delay_us", self.max_queue_delay_us, ">= 0")
        check_parameter(self.max_queue_texts >= buckets[-1], "max_queue_texts", self.max_queue_texts,
               f">= the largest batch bucket ({buckets[-1]})")
        check_parameter(self.default_timeout_us >= 0, "default_timeout_us", self.default_timeout_us, ">= 0 (0 = no timeout)")
        check_parameter(self.priority_levels >= 0, "priority_levels", self.priority_levels, ">= 0 (0 = priorities off)")
        check_parameter(
            0 <= self.default_priority_level <= self.priority_levels and (self.priority_levels == 0) == (self.default_priority_level == 0),
            "default_priority_level",
            self.default_priority_level,
            f"1..priority_levels ({self.priority_levels}), or 0 when priority_levels is 0",
        )
        check_parameter(0.0 < self.cost_ewma_alpha <= 1.0, "cost_ewma_alpha", self.cost_ewma_alpha, "in (0, 1]")
        check_parameter(self.min_padding_gain >= 1.0, "min_padding_gain", self.min_padding_gain, ">= 1.0")
        check_parameter(self.deadline_margin_us >= 0, "deadline_margin_us", self.deadline_margin_us, ">= 0")
        check_parameter(self.stage_lead_us >= 0, "stage_lead_us", self.stage_lead_us, ">= 0")
        check_parameter(self.cancel_check_after_us >= 0, "cancel_check_after_us", self.cancel_check_after_us,
                        ">= 0 (0 = ask every request)")
        check_parameter(self.drain_timeout_s > 0, "drain_timeout_s", self.drain_timeout_s, "> 0")


def parse_sections(parameters: Mapping[str, str], *classes: type) -> tuple[Any, ...]:
    """Split one model's parameters among several config dataclasses and build each.

    Each key goes to the dataclass that declares it; a key no class declares is an error that
    names the key and lists every known parameter (the ``parse_parameters`` rule, applied to
    the union).

    Args:
        parameters: key -> string value, e.g. from :func:`triton_parameters`.
        *classes: dataclasses with disjoint field names, e.g. ``TextEmbeddingConfig, SchedulerConfig``.

    Returns:
        One instance per class, in the order given.

    Raises:
        ConfigError: a key is unknown, or a value does not convert or validate.
    """
    owners = {f.name: cls for cls in classes for f in dataclasses.fields(cls)}
    unknown = sorted(set(parameters) - set(owners))
    if unknown:
        raise ConfigError(
            f"unknown config.pbtxt parameter {unknown[0]!r}; known parameters: {', '.join(sorted(owners))}"
        )
    return tuple(
        parse_parameters(cls, {k: v for k, v in parameters.items() if owners[k] is cls}) for cls in classes
    )
