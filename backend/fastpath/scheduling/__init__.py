"""FastPath's batch scheduler: a queue, a cost model and batch policies, driven with an injected clock.

Pure Python and testable without Triton (tests use :class:`FakeClock`). :class:`BatchQueue` holds
accepted items and what every policy shares (bound, timeouts, drain); a :class:`BatchPolicy`
decides what runs next: :class:`LengthBucketPolicy` (texts), :class:`ExactShapePolicy` (images of
one exact shape per batch), :class:`CallPlanPolicy` (everything now, in the cheapest calls).
:class:`BatchRunner` drives a queue with a stage / engine / completion pipeline.
Design and measurements: docs/design/scheduler.md, docs/benchmarks/scheduler_cpu.md.
"""

from fastpath.errors import QueueTimeoutError, RequestCancelledError
from fastpath.scheduling.batch import Batch, Decision
from fastpath.scheduling.call_plan import CallPlanPolicy
from fastpath.scheduling.clock import Clock, FakeClock, MonotonicClock
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.lengths import LengthBucketPolicy
from fastpath.scheduling.policy import BatchPolicy, BucketSpec, ItemBucket
from fastpath.scheduling.queue import BatchQueue
from fastpath.scheduling.runner import BatchHandler, BatchRunner, SchedulerObserver
from fastpath.scheduling.shapes import ExactShapePolicy
from fastpath.scheduling.tickets import Ticket, WorkItem, ask_cancelled

__all__ = [
    "Batch",
    "BatchHandler",
    "BatchPolicy",
    "BatchQueue",
    "BatchRunner",
    "BucketSpec",
    "CallPlanPolicy",
    "Clock",
    "CostModel",
    "Decision",
    "ExactShapePolicy",
    "FakeClock",
    "ItemBucket",
    "LengthBucketPolicy",
    "MonotonicClock",
    "QueueTimeoutError",
    "RequestCancelledError",
    "SchedulerObserver",
    "Ticket",
    "WorkItem",
    "ask_cancelled",
]
