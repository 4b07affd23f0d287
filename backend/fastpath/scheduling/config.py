"""Typed ``config.pbtxt`` parameters of FastPath's batch scheduler, shared by the scheduled models.

Each model subclasses :class:`SchedulerConfig` with its queue bound in its own unit
(``text_embedding``: ``max_queue_texts`` and its response modes; ``text_detection``:
``max_queue_images``), so a model's config refuses the parameters it does not use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar

from fastpath.config import check_parameter
from fastpath.errors import ConfigError
from fastpath.graphs.buckets import Sizes
from fastpath.scheduling.costs import CostModel


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Parameters of FastPath's batch scheduler (``fastpath.scheduling``), from ``config.pbtxt``.

    Each field is a parameter of the same name; its unit is in its name (``_us``, ``_s``, ``_ms``)
    and its meaning and default are in the knobs table of docs/design/scheduler.md. The defaults
    work untuned: the scheduler learns each batch shape's cost online, runs a batch as soon as the
    engine is free unless waiting is predicted to pay, and never waits longer than
    ``max_queue_delay_us``. ``batch_buckets`` are read through :meth:`batch_sizes`, which checks
    them against the engine. A model's subclass adds its queue bound, the field :attr:`QUEUE_BOUND`
    names, which must hold the largest batch bucket; a request that does not fit is answered
    UNAVAILABLE (HTTP 503), as with Triton's ``max_queue_size``.

    Raises:
        ConfigError: a value out of range, naming the parameter, the value and the expectation.
    """

    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    max_queue_delay_us: int = 2000
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
    metrics: bool = True
    metrics_interval_ms: int = 500
    stall_timeout_s: float = 60.0

    QUEUE_BOUND: ClassVar[str] = ""  # the subclass's queue-bound field, e.g. "max_queue_texts"; "" = unbounded

    def __post_init__(self) -> None:
        buckets = self.batch_buckets
        check_parameter(self.metrics_interval_ms >= 0, "metrics_interval_ms", self.metrics_interval_ms,
                        ">= 0 (0 = publish on the request path)")
        check_parameter(
            len(buckets) > 0 and list(buckets) == sorted(set(buckets)) and buckets[0] == 1,
            "batch_buckets",
            buckets,
            "a strictly increasing list of batch sizes starting at 1, e.g. 1,2,4,8,16,32,64",
        )
        check_parameter(self.max_queue_delay_us >= 0, "max_queue_delay_us", self.max_queue_delay_us, ">= 0")
        if self.QUEUE_BOUND:
            check_parameter(self.max_queue_items >= buckets[-1], self.QUEUE_BOUND, self.max_queue_items,
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

    @property
    def max_queue_items(self) -> int:
        """The queue bound in the model's unit (the field :attr:`QUEUE_BOUND` names).

        Raises:
            AttributeError: the config has no queue bound (the shared base itself).
        """
        if not self.QUEUE_BOUND:
            raise AttributeError(f"{type(self).__name__} has no queue bound: a model's scheduler config names one")
        return getattr(self, self.QUEUE_BOUND)

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
