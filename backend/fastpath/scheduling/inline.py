"""Running queued work on the caller's thread: :class:`BatchRunner`'s inline half.

``inline_when_idle`` (docs/design/scheduler.md, "Inline when idle"): a lone request at low load is
cheaper run by Triton's ``execute()`` thread itself than handed to the scheduler threads and back.
:meth:`InlineClaims.claim_idle` takes an idle runner for one such call, :meth:`~InlineClaims.drain_inline`
runs queued batches on it, :meth:`~InlineClaims.release_inline` gives the queue back to the
threads. text_embedding runs a claimed call's texts itself, outside the queue
(:mod:`fastpath.scheduling.call_plan`); the claim keeps the threads off the engine meanwhile.
"""

from __future__ import annotations

import threading
from typing import Any

from fastpath.profiling import PROFILE

# claim_idle(): how long the runner must have been idle. A closed-loop client at concurrency 1 leaves it idle
# for a whole client round trip (~1.1-1.4 ms through Triton on the dev machine: echo_embedding in
# docs/benchmarks/scheduler_cpu.md); when requests wait in Triton's queue, the next execute() follows the last
# answer within a stub round trip, and running it inline would turn batching into one call per request.
INLINE_MIN_IDLE_S = 0.5e-3


class InlineClaims:
    """The inline half of :class:`~fastpath.scheduling.runner.BatchRunner` (a base class: it uses the
    runner's lock ``_cond``, its queue, clock, batch preparer, ``_run``/``_complete`` and state flags)."""

    _cond: threading.Condition
    _inline: bool
    _started: bool
    _stopping: bool
    _last_busy_s: float
    _finishing: list[Any]
    queue: Any
    clock: Any
    _answers: Any

    def claim_idle(self) -> bool:
        """Claim an idle runner for one caller that will queue texts and :meth:`drain_inline` them.

        Returns True when nothing was queued, staged, running or being delivered for the last
        ``INLINE_MIN_IDLE_S`` (and the runner is not closing): the scheduler threads then leave the
        queue alone until :meth:`release_inline`. Returns False otherwise; the caller submits as usual.
        """
        with self._cond:
            if (self._inline or self._stopping or self.queue.closed or not self._idle()
                    or self.clock.now() - self._last_busy_s < INLINE_MIN_IDLE_S):
                return False
            self._inline = True
            return True

    def release_inline(self) -> None:
        """End a :meth:`claim_idle` claim; the scheduler threads take over again."""
        with self._cond:
            self._inline = False
            self._last_busy_s = self.clock.now()
            if len(self.queue) or self.queue.closed:  # work the threads left alone, or close() waiting
                self._cond.notify_all()

    def drain_inline(self) -> None:
        """Run every queued text to completion on the calling thread (threads never started, or under a claim).

        The queue's rules form the batches, flushed (no company can come); staging, engine and
        delivery run here in turn, with no thread hand-offs (on a GPU they cost more than the
        engine). Every ticket of the queued texts is answered before this returns.

        Raises:
            RuntimeError: the runner's threads are running (they own the queue then) and the
                caller holds no :meth:`claim_idle` claim.
        """
        if self._started and not self._inline:
            raise RuntimeError("drain_inline() is for a runner whose threads were never started, or under claim_idle()")
        while True:
            with self._cond:
                if not len(self.queue):
                    return
                mark = PROFILE.start()
                decision = self.queue.next_batch(self.clock.now(), flush=True)
                PROFILE.lap("scheduler.plan", mark)
            prepared = self._answers.prepare(decision)
            if prepared is None:
                continue
            batch, staged = prepared
            done = self._run(batch, staged, self.clock.now())
            with self._cond:
                self._finishing.append(batch)
            self._complete(done)
