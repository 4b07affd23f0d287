"""FastPath's batch scheduler: length-bucketed, cost-based batching with an injected clock.

Pure Python and testable without Triton (tests use :class:`FakeClock`). The policy core is
:class:`BatchQueue` (:class:`ShapeBatchQueue` for exact-shape buckets, e.g. images);
:class:`BatchRunner` drives it with a stage / engine / completion pipeline.
Design and measurements: docs/design/scheduler.md, docs/benchmarks/scheduler_cpu.md.
"""

from fastpath.errors import QueueTimeoutError, RequestCancelledError
from fastpath.scheduling.batch import Batch, Decision
from fastpath.scheduling.clock import Clock, FakeClock, MonotonicClock
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.queue import BatchQueue
from fastpath.scheduling.runner import BatchHandler, BatchRunner, SchedulerObserver
from fastpath.scheduling.shapes import ShapeBatchQueue
from fastpath.scheduling.tickets import Ticket, WorkItem

__all__ = [
    "Batch",
    "BatchHandler",
    "BatchQueue",
    "BatchRunner",
    "Clock",
    "CostModel",
    "Decision",
    "FakeClock",
    "MonotonicClock",
    "QueueTimeoutError",
    "RequestCancelledError",
    "SchedulerObserver",
    "ShapeBatchQueue",
    "Ticket",
    "WorkItem",
]
