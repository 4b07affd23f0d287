"""The threaded driver around :class:`~fastpath.scheduling.queue.BatchQueue`: host work overlaps the engine.

Three threads form a pipeline, so host work for batch N+1 overlaps the engine running batch N (engines release
the GIL):

    stager      once N is predicted to end within ``stage_lead_s``, forms N+1 (texts arriving during N join it),
                drops cancelled texts and stages it (``handler.stage``) into a one-slot hand-off.
    engine      runs the staged batch (``handler.run``), measures it on the injected clock and feeds the cost
                model; idle with nothing staged, it forms and stages the next batch itself.
    completion  delivers rows to tickets (``handler.finish``) while the engine runs the next batch; with nothing
                else in flight, the engine thread delivers the batch itself (no hand-off at low load).

With ``lanes`` > 1 there is one engine thread per lane, all fed from the one queue. A batch that runs alone gets
``lane=None`` (the handler's wide engine); once batches overlap, every batch runs on a lane until none has
overlapped for ``LANES_LINGER_S``. Every accepted ticket is answered exactly once (``answers.BatchPreparer``).
Design and why: docs/design/scheduler.md ("Architecture", "Pipelining", "Engine lanes").
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fastpath.errors import UnavailableError
from fastpath.profiling import PROFILE
from fastpath.scheduling.answers import BatchPreparer
from fastpath.scheduling.batch import Batch, Decision
from fastpath.scheduling.clock import Clock, MonotonicClock
from fastpath.scheduling.hooks import BatchHandler, SchedulerObserver
from fastpath.scheduling.inline import InlineClaims
from fastpath.scheduling.queue import BatchQueue
from fastpath.scheduling.tickets import WorkItem

LOG = logging.getLogger(__name__)

# With lanes: how long after batches last overlapped (or queued behind one another) a lone batch may run wide
# again: well past the period at which a wide session's spinning worker was measured slowing the lanes beside it
# (docs/design/scheduler.md, "Engine lanes").
LANES_LINGER_S = 0.25



@dataclasses.dataclass
class _Completion:
    batch: Batch
    outputs: Any
    error: BaseException | None
    seconds: float


class BatchRunner(InlineClaims):
    """Runs a :class:`BatchQueue`'s batches through a :class:`BatchHandler` on three threads.

    Args:
        queue: the queue and its batch policy (owned by the runner from now on).
        handler: stage/run/finish callbacks of the model.
        clock: time source; :class:`~fastpath.scheduling.clock.FakeClock` in tests.
        observer: metrics hooks.
        stage_lead_s: form and stage the next batch this long before the running one is predicted to end.
        check_cancellation: ask each ticket whether its client cancelled before running its texts.
        cancel_check_after_s: ask only tickets that waited at least this long (``answers.BatchPreparer``).
        name: thread-name prefix.
        lanes: engine threads (batches that may run at once); 1 = the handler's ``run(staged)`` only.
        on_delivered: called after each batch is delivered or failed (the model's liveness progress).

    Raises:
        ValueError: ``lanes`` < 1.
    """

    def __init__(self, queue: BatchQueue, handler: BatchHandler, *, clock: Clock | None = None,
                 observer: SchedulerObserver | None = None, stage_lead_s: float = 1e-3,
                 check_cancellation: bool = True, cancel_check_after_s: float = 0.0, name: str = "fastpath", lanes: int = 1,
                 on_delivered: Callable[[], None] | None = None) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        self.queue = queue
        self.lanes = lanes
        self.handler = handler
        self.clock = clock or MonotonicClock()
        self.observer = observer or SchedulerObserver()
        self.stage_lead_s = stage_lead_s
        self._on_delivered = on_delivered
        self._answers = BatchPreparer(queue, handler, self.observer, self.clock, check_cancellation, cancel_check_after_s)
        lock = threading.RLock()  # one lock, two conditions: the completion thread is not woken by every submit
        self._cond, self._delivered = threading.Condition(lock), threading.Condition(lock)
        self._slot: tuple[Batch, Any] | None = None
        self._running: dict[int, tuple[Batch, float]] = {}  # lane -> (the batch it runs, its predicted end)
        self._lanes_until_s = float("-inf")  # batches run on lanes, never wide, until then
        self._inline = False  # a caller runs batches itself (claim_idle); the threads keep off the queue
        self._last_busy_s = float("-inf")  # when the last batch was delivered or inline claim ended
        self._staging: Batch | None = None
        self._completions: collections.deque[_Completion] = collections.deque()
        self._finishing: list[Batch] = []  # batches being delivered (engine or completion thread)
        self._stopping = False
        steps: list[tuple[Any, tuple[int, ...], str]] = [(self._stage_step, (), "stage")]
        steps += [(self._engine_step, (lane,), "engine" if lanes == 1 else f"engine{lane}") for lane in range(lanes)]
        steps.append((self._completion_step, (), "completion"))
        self._threads = [
            threading.Thread(target=self._loop, args=(step, step_args), name=f"{name}-{label}", daemon=True)
            for step, step_args, label in steps
        ]
        self._started = False

    def start(self) -> BatchRunner:
        """Start the threads (once)."""
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()
        return self

    def submit(self, items: Sequence[WorkItem], *, timeout_s: float | None = None, arrival_s: float | None = None) -> None:
        """Queue one request's texts; its ticket will be answered exactly once.

        Args:
            items: the request's texts (``tokens``, ``payload``, ``priority_level`` set).
            timeout_s: Triton request timeout in seconds (None or 0: none); sets each item's deadline.
            arrival_s: when the request reached the model (clock seconds; default now), when its
                preparation (e.g. image decoding) took time of its own: the timeout and the queue
                delay count from then.

        Raises:
            UnavailableError: queue full or shutting down (the caller answers the request itself).
        """
        def attempt() -> None:  # under the lock
            now = self.clock.now()
            start_s = now if arrival_s is None else min(arrival_s, now)
            for item in items:
                item.arrival_s = start_s
                item.deadline_s = start_s + timeout_s if timeout_s else None
            busy = bool(self._running) or self._slot is not None or self._staging is not None
            self.queue.submit(items, now, engine_busy=busy)
            if not self._inline and self._may_act_on_new_texts(now, timeout_s):
                self._cond.notify_all()

        self._with_room(len(items), attempt)

    def _with_room(self, count: int, attempt: Callable[[], None]) -> None:
        """Run ``attempt`` under the lock; if the queue is full, first answer the queued requests whose clients
        cancelled (they would hold their room until a batch forms: ``BatchPreparer.sweep_due``) and try once more.

        Raises:
            UnavailableError: still full, or shutting down (counted as rejected).
        """
        swept = False
        while True:
            with self._cond:
                try:
                    attempt()
                    return
                except UnavailableError:
                    tickets = [] if swept or self.queue.closed else self._answers.sweep_due(self.clock.now())
                    if not tickets:
                        self.observer.rejected("shutdown" if self.queue.closed else "queue_full", count)
                        raise
            swept = True
            if self._answers.fail_cancelled(tickets):  # outside the lock: each ask is a round trip to Triton
                with self._cond:
                    self.queue.drop_answered()

    def _may_act_on_new_texts(self, now: float, timeout_s: float | None) -> bool:
        """Under the lock: whether a thread could act on texts just queued before its next timed wake-up.

        An idle lane's engine thread forms batches; while every lane runs one, the stager sleeps until
        ``stage_lead_s`` before the earliest predicted end (new texts do not move it) or, once past that,
        until a staged batch is taken. Only a timeout can pull its next wake-up earlier. Under load every
        lane is busy, and waking the stager for each request cost a futex round trip and a GIL hand-off
        for nothing. (Under claim_idle the caller keeps the threads off the queue: see :meth:`submit`.)
        """
        if len(self._running) < self.lanes or timeout_s:
            return True
        if self._slot is not None or self._staging is not None:
            return False
        return now >= min(end_s for _, end_s in self._running.values()) - self.stage_lead_s

    def check_room(self, count: int) -> None:
        """Raise (and count as rejected) what :meth:`submit` would for ``count`` more items, before costly preparation
        (a full queue first answers its cancelled requests, as :meth:`submit` does).

        Raises:
            UnavailableError: queue full or shutting down.
        """
        self._with_room(count, lambda: self.queue.check_room(count))

    # -- shutdown ---------------------------------------------------------------------------------

    def _idle(self) -> bool:
        return not (len(self.queue) or self._slot or self._running or self._staging or self._completions or self._finishing)

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
            batches = [b for b in (self._staging, *(batch for batch, _ in self._running.values())) if b is not None]
            batches += self._finishing
            batches += [self._slot[0]] if self._slot else []
            batches += [done.batch for done in self._completions]
            self._slot = None
            self._completions.clear()
            self._stopping = True
            self._cond.notify_all()
            self._delivered.notify_all()
        error = UnavailableError(
            f"the model was unloaded before this request finished (drain_timeout_s={drain_timeout_s}); retry"
        )
        self._answers.fail_items(left + [item for batch in batches for item in batch.items], error, "shutdown")
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=1.0)

    # -- threads ----------------------------------------------------------------------------------

    def _loop(self, step: Any, step_args: tuple[int, ...]) -> None:
        while True:
            try:
                if not step(*step_args):
                    return
            except Exception:  # a bug in one step must not silently stop the pipeline
                LOG.exception("scheduler thread %s failed; continuing", threading.current_thread().name)

    def _stage_step(self) -> bool:
        """Stager thread: form and stage the next batch while the engine is still running one; and
        answer texts whose timeout passes while every engine is busy (at their timeout, not at the
        next batch, which can come 1.4 s later under load)."""
        with self._cond:
            while True:
                if self._stopping:
                    return False
                now = self.clock.now()
                expiry_s = float("inf") if self._inline or not len(self.queue) else self.queue.next_expiry_s()
                if now >= expiry_s:
                    decision = Decision(None, self.queue.expire(now), None)
                    if decision.expired:
                        staging = False
                        break
                wake_s = None
                # Only when every lane is busy: an idle lane's engine thread forms its own batch.
                if self._slot is None and self._staging is None and len(self._running) == self.lanes:
                    wake_s = min(end_s for _, end_s in self._running.values()) - self.stage_lead_s
                    if now >= wake_s:
                        mark = PROFILE.start()
                        decision = self.queue.next_batch(now)
                        PROFILE.lap("scheduler.plan", mark)
                        if decision.batch is not None or decision.expired:
                            self._staging = decision.batch
                            staging = True
                            break
                        wake_s = decision.wake_s
                if wake_s is None or expiry_s < wake_s:
                    wake_s = None if expiry_s == float("inf") else expiry_s
                self.clock.wait_until(self._cond, wake_s)
        prepared = self._answers.prepare(decision)  # answers the expired texts; stages the batch, if any
        if staging:
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
            if self._staging is None and not self._inline:  # the idle engine forms its own batch
                mark = PROFILE.start()
                decision = self.queue.next_batch(self.clock.now())
                PROFILE.lap("scheduler.plan", mark)
                if decision.batch is not None or decision.expired:
                    self._staging = decision.batch
                    self._cond.release()
                    try:
                        prepared = self._answers.prepare(decision)
                    finally:
                        self._cond.acquire()
                    self._staging = None
                    self._cond.notify_all()
                    return prepared
                wake_s = decision.wake_s
            self.clock.wait_until(self._cond, wake_s)
        prepared, self._slot = self._slot, None
        return prepared

    def _engine_step(self, lane: int = 0) -> bool:
        """Engine thread of ``lane``: run the next staged batch, measure it, queue it for completion."""
        with self._cond:
            prepared = self._next_for_engine()
            if prepared is False:
                return False
            if prepared is None:
                return True
            batch, staged = prepared
            start_s = self.clock.now()
            run_lane = self._choose_lane(lane, start_s)
            self._running[lane] = (batch, start_s + batch.predicted_s)
            self._cond.notify_all()
        done = self._run(batch, staged, start_s, run_lane)
        with self._cond:
            del self._running[lane]
            # Nothing else in flight (low load): deliver here and save the hand-off to the completion thread.
            inline = not (self._completions or self._finishing or self._slot or self._staging or len(self.queue)
                          or self._running)
            if inline:
                self._finishing.append(batch)
            else:
                self._completions.append(done)
                self._delivered.notify()
            self._cond.notify_all()
        if inline:
            self._complete(done)
        return True

    def _choose_lane(self, lane: int, now: float) -> int | None:
        """Under the lock: ``lane`` for a batch about to run there, or None for the wide engine.

        Wide only with several lanes configured, nothing running beside it, nothing queued behind
        it, and no such overlap within ``LANES_LINGER_S``.
        """
        if self.lanes == 1:
            return None
        if self._running or self._slot or len(self.queue):
            self._lanes_until_s = now + LANES_LINGER_S
        return lane if now < self._lanes_until_s else None

    def _run(self, batch: Batch, staged: Any, start_s: float, lane: int | None = None) -> _Completion:
        """Run the engine on one staged batch and feed its time to the cost model. Never raises.

        ``lane``: None runs ``handler.run(staged)``; a lane index (only with ``lanes`` > 1) runs
        ``handler.run(staged, lane=lane)``.
        """
        outputs, error = None, None
        mark = PROFILE.start()
        try:
            outputs = self.handler.run(staged) if lane is None else self.handler.run(staged, lane=lane)
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
                self.clock.wait_until(self._delivered, None)
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
                self._answers.fail_batch(done.batch, error)
        finally:
            with self._cond:
                self._finishing.remove(done.batch)
                self._last_busy_s = self.clock.now()
                if self.queue.closed:  # only close() waits on a delivery (for the runner to go idle)
                    self._cond.notify_all()
            if self._on_delivered is not None:
                self._on_delivered()
            PROFILE.lap("scheduler.finish", mark, len(done.batch.items))
