"""Turning the queue's decisions into staged batches, and answering tickets that will not run.

:class:`BatchPreparer` is the part of :class:`~fastpath.scheduling.runner.BatchRunner` that touches
tickets outside the engine: it answers expired texts (Triton's request timeout), drops texts whose
request was cancelled or already answered, stages the rest (``handler.stage``), and fails the texts
of a batch with an error. It holds no lock and no thread: the runner calls it outside its lock, from
whichever thread forms the batch (stager, an idle engine thread, or an inline caller).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from fastpath.errors import QueueTimeoutError, RequestCancelledError
from fastpath.profiling import PROFILE
from fastpath.scheduling.batch import Batch, Decision
from fastpath.scheduling.clock import Clock
from fastpath.scheduling.hooks import BatchHandler, SchedulerObserver
from fastpath.scheduling.queue import BatchQueue
from fastpath.scheduling.tickets import Ticket, WorkItem

LOG = logging.getLogger(__name__)
# How often a full queue may ask its waiting requests whether their clients cancelled: each ask is a round trip
# to tritonserver (~20-30 us), and a queue of 1,024 one-text requests that none cancelled costs ~25 ms to ask.
CANCEL_SWEEP_INTERVAL_S = 0.25


class BatchPreparer:
    """Stages a :class:`Decision`'s batch and answers the texts that leave it.

    Args:
        queue: the runner's queue (its policy's batch sizes and cost model re-price a shrunk batch).
        handler: the model's ``stage`` callback.
        observer: metrics hooks (``dispatched``, ``rejected``).
        clock: the runner's time source (timeout messages of texts that expire without a batch).
        check_cancellation: ask each ticket whether its client cancelled before running its texts.
        cancel_check_after_s: ask only tickets whose texts waited at least this long (clock seconds,
            arrival to batch formation) when their batch forms; 0 asks every ticket. Why: in
            Triton's python backend each ask is a stub-to-server round trip
            (``SchedulerConfig.cancel_check_after_us``).
    """

    def __init__(self, queue: BatchQueue, handler: BatchHandler, observer: SchedulerObserver, clock: Clock,
                 check_cancellation: bool = True, cancel_check_after_s: float = 0.0) -> None:
        self.queue = queue
        self.clock = clock
        self.handler = handler
        self.observer = observer
        self.check_cancellation = check_cancellation
        self.cancel_check_after_s = cancel_check_after_s
        self._next_sweep_s = float("-inf")  # when a full queue may next ask its requests whether they were cancelled

    def prepare(self, decision: Decision) -> tuple[Batch, Any] | None:
        """Answer expired texts, drop cancelled ones, stage the batch. Never raises.

        Returns (batch, staged inputs), or None when nothing is left to run. The runner marks the
        batch as being staged before calling and clears that mark after; an exception escaping here
        would skip the clear and wedge the stager and the engine thread forever (each waits for the
        other's staging to end). So any unexpected error (a metrics hook, a cancellation probe, a
        response send) fails that batch's texts with the error, like an engine error, and the
        pipeline goes on.
        """
        try:
            return self._prepare(decision)
        except Exception as exc:
            LOG.exception("preparing a batch failed; its texts are answered with the error")
            self.fail_items(list(decision.expired) + list(decision.batch.items if decision.batch else ()), exc, None)
            return None

    def _prepare(self, decision: Decision) -> tuple[Batch, Any] | None:
        now = decision.batch.formed_s if decision.batch else self.clock.now()
        for item in decision.expired:
            waited_us = (now - item.arrival_s) * 1e6
            timeout_us = ((item.deadline_s or now) - item.arrival_s) * 1e6
            self.fail_items([item], QueueTimeoutError(
                f"Request timeout expired: the request waited {waited_us:.0f} us in the queue and its timeout "
                f"is {timeout_us:.0f} us; retry with a longer timeout or when the server is less loaded"), "timeout")
        batch = self._drop_cancelled(decision.batch) if decision.batch else None
        if batch is None:
            return None
        self.observer.dispatched(batch, [now - item.arrival_s for item in batch.items])
        try:
            mark = PROFILE.start()
            staged = self.handler.stage(batch)
            PROFILE.lap("scheduler.stage", mark, len(batch.items))
            return batch, staged
        except Exception as exc:
            self.fail_batch(batch, exc)
            return None

    def _drop_cancelled(self, batch: Batch) -> Batch | None:
        """Remove texts whose ticket is answered or cancelled (asked only after ``cancel_check_after_s``
        of waiting); re-snap the batch size."""
        verdicts: dict[int, bool] = {}
        keep = []
        probe_before_s = batch.formed_s - self.cancel_check_after_s  # tickets that arrived by then are asked
        for item in batch.items:
            ticket = item.ticket
            if id(ticket) not in verdicts:
                verdicts[id(ticket)] = ticket.done or (self.check_cancellation and item.arrival_s <= probe_before_s
                                                       and ticket.is_cancelled())
                if verdicts[id(ticket)] and ticket.fail(RequestCancelledError("the request was cancelled before it ran")):
                    self.observer.rejected("cancelled", ticket.rows)
            if not verdicts[id(ticket)]:
                keep.append(item)
        if len(keep) == len(batch.items):
            return batch
        if not keep:
            return None
        size = self.queue.policy.rows_for(len(keep))
        return dataclasses.replace(batch, items=tuple(keep), batch_size=size,
                                   predicted_s=self.queue.costs.estimate(size, batch.length))

    def sweep_due(self, now: float) -> list[Ticket]:
        """Under the runner's lock, for a full queue: the requests to ask whether their clients cancelled (those
        that waited ``cancel_check_after_s``, oldest first); none when asking is off or the last sweep was less than
        :data:`CANCEL_SWEEP_INTERVAL_S` ago."""
        if not self.check_cancellation or now < self._next_sweep_s:
            return []
        self._next_sweep_s = now + CANCEL_SWEEP_INTERVAL_S
        return self.queue.waiting_tickets(now - self.cancel_check_after_s)

    def fail_cancelled(self, tickets: Sequence[Ticket]) -> int:
        """Ask each of ``tickets`` (queued, not dispatched) whether its client cancelled, and answer those that did
        with CANCELLED; returns how many. Called outside the runner's lock: each ask is a round trip."""
        cancelled = 0
        for ticket in tickets:
            if ticket.is_cancelled() and ticket.fail(RequestCancelledError("the request was cancelled before it ran")):
                self.observer.rejected("cancelled", ticket.rows)
                cancelled += 1
        return cancelled

    def fail_batch(self, batch: Batch, error: BaseException) -> None:
        """Answer every ticket of ``batch`` with ``error`` (an engine or staging failure)."""
        LOG.error("a batch of %d texts [%d x %d] failed: %s", len(batch.items), batch.batch_size, batch.length, error)
        self.fail_items(batch.items, error, None)

    def fail_items(self, items: Sequence[WorkItem], error: BaseException, reason: str | None) -> None:
        """Answer each distinct ticket of ``items`` with ``error`` (tickets already answered are skipped);
        count them as rejected for ``reason`` (``timeout`` | ``shutdown`` | ...) unless it is None."""
        seen: set[int] = set()
        for item in items:
            if id(item.ticket) in seen:
                continue
            seen.add(id(item.ticket))
            if item.ticket.fail(error) and reason:
                self.observer.rejected(reason, item.ticket.rows)
