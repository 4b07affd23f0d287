"""The threaded driver around :class:`~fastpath.scheduling.queue.BatchQueue`.

Three threads form a pipeline, so host work for batch N+1 overlaps the engine running batch N
(engines release the GIL while running):

    stager      while the engine runs batch N, waits until N is predicted to end within
                ``stage_lead_s`` (cost model), then asks the queue for batch N+1, drops cancelled
                texts and stages it (``handler.stage``: padding into engine inputs) into a one-slot
                hand-off. Forming N+1 late, not when N starts, lets texts that arrive during N join.
    engine      runs the staged batch (``handler.run``), measures it on the injected clock and feeds
                the cost model. When it is idle and nothing is staged, it forms and stages the next
                batch itself, so a lone request at low load costs no thread hand-off;
    completion  delivers rows to tickets (``handler.finish``), which send the responses, while the
                engine already runs the next batch. When nothing else is in flight, the engine thread
                delivers the batch itself (no hand-off at low load).

Texts are tokenized before :meth:`BatchRunner.submit` (in Triton's ``execute`` thread), which also
overlaps the engine. Every accepted ticket is answered exactly once: with its rows, or with the
error of the batch that failed, its timeout, its cancellation, or shutdown.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

from fastpath.errors import UnavailableError
from fastpath.profiling import PROFILE
from fastpath.scheduling.clock import Clock, MonotonicClock
from fastpath.scheduling.hooks import BatchHandler, SchedulerObserver
from fastpath.scheduling.queue import Batch, BatchQueue
from fastpath.scheduling.tickets import QueueTimeoutError, RequestCancelledError, WorkItem

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class _Completion:
    batch: Batch
    outputs: Any
    error: BaseException | None
    seconds: float


class BatchRunner:
    """Runs a :class:`BatchQueue`'s batches through a :class:`BatchHandler` on three threads.

    Args:
        queue: the policy core (owned by the runner from now on).
        handler: stage/run/finish callbacks of the model.
        clock: time source; :class:`~fastpath.scheduling.clock.FakeClock` in tests.
        observer: metrics hooks.
        stage_lead_s: form and stage the next batch this long before the running one is predicted to end.
        check_cancellation: ask each ticket whether its client cancelled before running its texts.
        name: thread-name prefix.
    """

    def __init__(self, queue: BatchQueue, handler: BatchHandler, *, clock: Clock | None = None,
                 observer: SchedulerObserver | None = None, stage_lead_s: float = 1e-3,
                 check_cancellation: bool = True, name: str = "fastpath") -> None:
        self.queue = queue
        self.handler = handler
        self.clock = clock or MonotonicClock()
        self.observer = observer or SchedulerObserver()
        self.stage_lead_s = stage_lead_s
        self.check_cancellation = check_cancellation
        self._cond = threading.Condition()
        self._slot: tuple[Batch, Any] | None = None
        self._running: Batch | None = None
        self._busy_until_s = 0.0
        self._staging: Batch | None = None
        self._completions: collections.deque[_Completion] = collections.deque()
        self._finishing: list[Batch] = []  # batches being delivered (engine or completion thread)
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._loop, args=(step,), name=f"{name}-{step.__name__.strip('_')}", daemon=True)
            for step in (self._stage_step, self._engine_step, self._completion_step)
        ]
        self._started = False

    def start(self) -> "BatchRunner":
        """Start the threads (once)."""
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()
        return self

    def now(self) -> float:
        return self.clock.now()

    def submit(self, items: Sequence[WorkItem], *, timeout_s: float | None = None) -> None:
        """Queue one request's texts; its ticket will be answered exactly once.

        Args:
            items: the request's texts (``tokens``, ``payload``, ``priority_level`` set).
            timeout_s: Triton request timeout in seconds (None or 0: none); sets each item's deadline.

        Raises:
            UnavailableError: queue full or shutting down (the caller answers the request itself).
        """
        with self._cond:
            now = self.clock.now()
            for item in items:
                item.arrival_s = now
                item.deadline_s = now + timeout_s if timeout_s else None
            try:
                busy = self._running is not None or self._slot is not None or self._staging is not None
                self.queue.submit(items, now, engine_busy=busy)
            except UnavailableError:
                self.observer.rejected("shutdown" if self.queue.closed else "queue_full", len(items))
                raise
            self._cond.notify_all()

    def drain_inline(self) -> None:
        """Run every queued text to completion on the calling thread (``response_mode=return``).

        The queue's rules form the batches, flushed (no company can come); staging, engine and
        delivery run here in turn, with no thread hand-offs (on a GPU they cost more than the
        engine). Every ticket of the queued texts is answered before this returns.

        Raises:
            RuntimeError: the runner's threads are running (they own the queue then).
        """
        if self._started:
            raise RuntimeError("drain_inline() is for a runner whose threads were never started")
        while True:
            with self._cond:
                if not len(self.queue):
                    return
                mark = PROFILE.start()
                decision = self.queue.next_batch(self.clock.now(), flush=True)
                PROFILE.lap("scheduler.plan", mark)
            prepared = self._prepare(decision)
            if prepared is None:
                continue
            batch, staged = prepared
            done = self._run(batch, staged, self.clock.now())
            with self._cond:
                self._finishing.append(batch)
            self._complete(done)

    # -- shutdown ---------------------------------------------------------------------------------

    def _idle(self) -> bool:
        return not (len(self.queue) or self._slot or self._running or self._staging
                    or self._completions or self._finishing)

    def close(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting, run what is queued (drain), then stop the threads.

        Whatever has not finished after ``drain_timeout_s`` (clock seconds) is answered with
        UnavailableError, so every accepted ticket still gets exactly one answer. Idempotent.
        """
        with self._cond:
            if self._stopping:
                return
            self.queue.close()
            self._cond.notify_all()
            deadline_s = self.clock.now() + drain_timeout_s
            while self._started and not self._idle() and self.clock.now() < deadline_s:
                self.clock.wait_until(self._cond, deadline_s)
            left = self.queue.remove_all()
            batches = [b for b in (self._staging, self._running) if b is not None] + self._finishing
            batches += [self._slot[0]] if self._slot else []
            batches += [done.batch for done in self._completions]
            self._slot = None
            self._completions.clear()
            self._stopping = True
            self._cond.notify_all()
        error = UnavailableError(
            f"the model was unloaded before this request finished (drain_timeout_s={drain_timeout_s}); retry"
        )
        self._fail_items(left + [item for batch in batches for item in batch.items], error, "shutdown")
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=1.0)

    # -- threads ----------------------------------------------------------------------------------

    def _loop(self, step: Any) -> None:
        while True:
            try:
                if not step():
                    return
            except Exception:  # a bug in one step must not silently stop the pipeline
                LOG.exception("scheduler thread %s failed; continuing", threading.current_thread().name)

    def _stage_step(self) -> bool:
        """Stager thread: form and stage the next batch while the engine is still running one."""
        with self._cond:
            while True:
                if self._stopping:
                    return False
                wake_s = None
                if self._slot is None and self._staging is None and self._running is not None:
                    now = self.clock.now()
                    wake_s = self._busy_until_s - self.stage_lead_s
                    if now >= wake_s:
                        mark = PROFILE.start()
                        decision = self.queue.next_batch(now)
                        PROFILE.lap("scheduler.plan", mark)
                        if decision.batch is not None or decision.expired:
                            self._staging = decision.batch
                            break
                        wake_s = decision.wake_s
                self.clock.wait_until(self._cond, wake_s)
        prepared = self._prepare(decision)
        with self._cond:
            self._staging = None
            self._slot = prepared or self._slot
            self._cond.notify_all()
        return True

    def _next_for_engine(self) -> tuple[Batch, Any] | None | bool:
        """Engine thread, under the lock: the staged batch, or (engine idle) form one here without a hand-off.

        Returns the staged (batch, inputs), None when only expired texts were handled, or False to stop.
        """
        while self._slot is None:
            if self._stopping:
                return False
            wake_s = None
            if self._staging is None:  # the stager is not forming one: the idle engine forms its own
                mark = PROFILE.start()
                decision = self.queue.next_batch(self.clock.now())
                PROFILE.lap("scheduler.plan", mark)
                if decision.batch is not None or decision.expired:
                    self._staging = decision.batch
                    self._cond.release()
                    try:
                        prepared = self._prepare(decision)
                    finally:
                        self._cond.acquire()
                    self._staging = None
                    self._cond.notify_all()
                    return prepared
                wake_s = decision.wake_s
            self.clock.wait_until(self._cond, wake_s)
        prepared, self._slot = self._slot, None
        return prepared

    def _prepare(self, decision: Any) -> tuple[Batch, Any] | None:
        """Outside the lock: answer expired texts, drop cancelled ones, stage the batch. Never raises.

        Both callers mark the batch as being staged (``self._staging``) before calling and clear
        that mark after; an exception escaping here would skip the clear and wedge the stager and
        the engine thread forever (each waits for the other's staging to end). So any unexpected
        error (a metrics hook, a cancellation probe, a response send) fails that batch's texts
        with the error, like an engine error, and the pipeline goes on.
        """
        try:
            return self._prepare_unsafe(decision)
        except Exception as exc:
            LOG.exception("preparing a batch failed; its texts are answered with the error")
            self._fail_items(list(decision.expired) + list(decision.batch.items if decision.batch else ()), exc, None)
            return None

    def _prepare_unsafe(self, decision: Any) -> tuple[Batch, Any] | None:
        now = decision.batch.formed_s if decision.batch else self.clock.now()
        for item in decision.expired:
            waited_us = (now - item.arrival_s) * 1e6
            timeout_us = ((item.deadline_s or now) - item.arrival_s) * 1e6
            self._fail_items([item], QueueTimeoutError(
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
            self._fail_batch(batch, exc)
            return None

    def _drop_cancelled(self, batch: Batch) -> Batch | None:
        """Remove texts whose ticket is answered or cancelled; re-snap the batch size."""
        verdicts: dict[int, bool] = {}
        keep = []
        for item in batch.items:
            ticket = item.ticket
            if id(ticket) not in verdicts:
                verdicts[id(ticket)] = ticket.done or (self.check_cancellation and ticket.is_cancelled())
                if verdicts[id(ticket)] and ticket.fail(RequestCancelledError("the request was cancelled before it ran")):
                    self.observer.rejected("cancelled", ticket.rows)
            if not verdicts[id(ticket)]:
                keep.append(item)
        if len(keep) == len(batch.items):
            return batch
        if not keep:
            return None
        size = self.queue.snap_up(len(keep))
        return dataclasses.replace(batch, items=tuple(keep), batch_size=size,
                                   predicted_s=self.queue.costs.estimate(size, batch.length))

    def _engine_step(self) -> bool:
        """Engine thread: run the next staged batch, measure it, queue it for completion."""
        with self._cond:
            prepared = self._next_for_engine()
            if prepared is False:
                return False
            if prepared is None:
                return True
            batch, staged = prepared
            start_s = self.clock.now()
            self._running, self._busy_until_s = batch, start_s + batch.predicted_s
            self._cond.notify_all()
        done = self._run(batch, staged, start_s)
        with self._cond:
            self._running = None
            # Nothing else in flight (low load): deliver here and save the hand-off to the completion thread.
            inline = not (self._completions or self._finishing or self._slot or self._staging or len(self.queue))
            if inline:
                self._finishing.append(batch)
            else:
                self._completions.append(done)
            self._cond.notify_all()
        if inline:
            self._complete(done)
        return True

    def _run(self, batch: Batch, staged: Any, start_s: float) -> _Completion:
        """Run the engine on one staged batch and feed its time to the cost model. Never raises."""
        outputs, error = None, None
        mark = PROFILE.start()
        try:
            outputs = self.handler.run(staged)
        except Exception as exc:  # only this batch fails
            error = exc
        PROFILE.lap("scheduler.run", mark, len(batch.items))
        seconds = self.clock.now() - start_s
        if error is None:
            try:
                self.queue.costs.observe(batch.batch_size, batch.length, seconds)
            except Exception:  # a bad measurement must not leave the batch marked running forever
                LOG.exception("recording the cost of a [%d x %d] batch failed", batch.batch_size, batch.length)
        return _Completion(batch, outputs, error, seconds)

    def _completion_step(self) -> bool:
        with self._cond:
            while not self._completions:
                if self._stopping:
                    return False
                self.clock.wait_until(self._cond, None)
            done = self._completions.popleft()
            self._finishing.append(done.batch)
        self._complete(done)
        return True

    def _complete(self, done: _Completion) -> None:
        """Deliver one finished batch (the caller put it in ``self._finishing``), then take it out."""
        error = done.error
        mark = PROFILE.start()
        try:
            try:
                self.observer.batch_done(done.batch, done.seconds, error)
            except Exception:  # metrics must never cost an answer
                LOG.exception("the scheduler observer failed on batch_done")
            if error is None:
                try:
                    self.handler.finish(done.batch, done.outputs)
                except Exception as exc:
                    error = exc
            if error is not None:
                self._fail_batch(done.batch, error)
        finally:
            with self._cond:
                self._finishing.remove(done.batch)
                self._cond.notify_all()
            PROFILE.lap("scheduler.finish", mark, len(done.batch.items))

    def _fail_batch(self, batch: Batch, error: BaseException) -> None:
        LOG.error("a batch of %d texts [%d x %d] failed: %s", len(batch.items), batch.batch_size, batch.length, error)
        self._fail_items(batch.items, error, None)

    def _fail_items(self, items: Sequence[WorkItem], error: BaseException, reason: str | None) -> None:
        """Answer each distinct ticket of ``items`` with ``error`` (tickets already answered are skipped)."""
        seen: set[int] = set()
        for item in items:
            if id(item.ticket) in seen:
                continue
            seen.add(id(item.ticket))
            if item.ticket.fail(error) and reason:
                self.observer.rejected(reason, item.ticket.rows)
