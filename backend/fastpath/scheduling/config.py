"""Typed ``config.pbtxt`` parameters of FastPath's batch scheduler, shared by the scheduled models."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from fastpath.config import check_parameter
from fastpath.errors import ConfigError
from fastpath.graphs.buckets import Sizes
from fastpath.scheduling.costs import CostModel

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
            per engine call. Read through :meth:`batch_sizes`, which checks them against the
            engine's limit and its captured sizes.
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
            long when its batch forms; 0 = ask every request. Each ``is_cancelled()`` is a
            stub-to-server round trip, and clients cancel after long waits, so the default (250 ms)
            asks only requests that waited past a healthy server's p99 (docs/design/scheduler.md).
        response_mode: ``sender`` (default): ``execute()`` returns at once and each request is
            answered through its response sender, so one instance batches across calls. ``return``:
            ``execute()`` runs its requests' batches itself and returns their responses, one stub
            round trip per call; pair it with ``dynamic_batching`` (0 us) and several instances
            (docs/design/scheduler.md, docs/benchmarks/triton_gpu_h200.md).
        inline_when_idle: ``sender`` mode: a one-request ``execute()`` that finds the scheduler idle
            runs its batches itself and returns its response, saving the thread hand-offs and the
            sender's round trip; needs ``dynamic_batching`` (0 us) in front, and only requests of at
            most half of ``max_batch_size`` texts run inline (docs/design/scheduler.md).
        metrics: publish the scheduler's and the staging pool's custom metrics (each update is a
            stub-to-server round trip: publish them with ``metrics_interval_ms``).
        metrics_interval_ms: publish metrics from a background thread every this many
            milliseconds (and at unload) instead of on the request path; the request path only
            records into local buffers. A scrape may trail the last batches by this much. 0:
            publish each update on the request path as it happens.
        stall_timeout_s: liveness: the instance counts as stalled when requests are in flight and
            none was answered and no batch finished for this many seconds, or its heartbeat (written
            every second) is this old; ``fastpath serve`` then kills its stub and reloads the model,
            and ``python -m fastpath.server.stubs --check`` fails (:mod:`fastpath.triton.progress`).
            Above the longest batch the engine may take under load; 0 = not watched.
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
    stall_timeout_s: float = 60.0

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
        check_parameter(self.stall_timeout_s >= 0, "stall_timeout_s", self.stall_timeout_s, ">= 0 seconds (0 = not watched)")

    def batch_sizes(self, *, max_rows: int, max_rows_name: str, captured: Iterable[int] = ()) -> Sizes:
        """``batch_buckets`` as the batch sizes the model's scheduler runs, checked against its engine.

        Args:
            max_rows: the most rows the model's engine takes in one call.
            max_rows_name: the parameter that sets ``max_rows`` (for the message).
            captured: the batch sizes the loaded engine captured (CUDA graphs, optimization
                profiles); empty when it runs any size. A batch size outside them would be padded
                again by the engine, so each bucket must be one of them.

        Raises:
            ConfigError: the largest bucket exceeds ``max_rows``, or a bucket is not among
                ``captured``; the message names the parameter, its value and what to change.
        """
        sizes = Sizes(self.batch_buckets, name="batch_buckets")
        if sizes.largest > max_rows:
            raise ConfigError(f"config.pbtxt parameter 'batch_buckets' = {sizes}: its largest bucket exceeds "
                              f"{max_rows_name}={max_rows}; drop the larger buckets or raise {max_rows_name}")
        captured = tuple(captured)
        return sizes.within(captured, name="batch_buckets", owner="the engine") if captured else sizes

    def policy_options(self) -> dict[str, Any]:
        """The keyword arguments of the cost-rule batch policies (:class:`~fastpath.scheduling.LengthBucketPolicy`,
        :class:`~fastpath.scheduling.ExactShapePolicy`) this config sets, in seconds: a fresh ``costs``
        model, ``max_queue_delay_s``, ``deadline_margin_s`` and ``min_padding_gain``. The batch sizes
        (:meth:`batch_sizes`) and the buckets are the model's to add."""
        return {"costs": CostModel(self.cost_ewma_alpha), "max_queue_delay_s": self.max_queue_delay_us * 1e-6,
                "deadline_margin_s": self.deadline_margin_us * 1e-6, "min_padding_gain": self.min_padding_gain}

    def runner_options(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~fastpath.scheduling.BatchRunner` this config sets, in
        seconds: ``stage_lead_s``, ``check_cancellation`` and ``cancel_check_after_s``."""
        return {"stage_lead_s": self.stage_lead_us * 1e-6, "check_cancellation": self.check_cancellation,
                "cancel_check_after_s": self.cancel_check_after_us * 1e-6}
