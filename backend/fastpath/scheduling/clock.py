"""Injected monotonic clocks: the scheduler never reads the wall clock itself.

Every time the scheduler uses comes from a :class:`Clock`, and every timed wait goes through
:meth:`Clock.wait_until` (an absolute deadline, so a wait can never miss a clock step).
Production uses :class:`MonotonicClock` (``time.monotonic``); tests use :class:`FakeClock`, whose
time moves only when the test calls :meth:`FakeClock.advance`, so tests are exact and never sleep
(STYLE.md: "Time is injected").
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic time source in seconds, plus a condition wait that honours it."""

    def now(self) -> float:
        """Current monotonic time in seconds (arbitrary origin)."""

    def wait_until(self, condition: threading.Condition, deadline_s: float | None) -> None:
        """Wait on ``condition`` (held by the caller) until notified or this clock reaches ``deadline_s``.

        ``None`` waits until notified. Spurious wake-ups are allowed; callers re-check their state.
        """


NON_FINITE_RECHECK_S = 1.0


class MonotonicClock:
    """``time.monotonic`` and ``Condition.wait`` with a real timeout."""

    def now(self) -> float:
        return time.monotonic()

    def wait_until(self, condition: threading.Condition, deadline_s: float | None) -> None:
        if deadline_s is None:
            condition.wait()
        elif not math.isfinite(deadline_s):
            # A non-finite wake time (e.g. a cost estimate that overflowed) must neither raise
            # (Condition.wait(inf) raises OverflowError) nor spin: re-check once a second.
            condition.wait(NON_FINITE_RECHECK_S)
        else:
            condition.wait(min(max(0.0, deadline_s - time.monotonic()), threading.TIMEOUT_MAX))


class FakeClock:
    """A clock that moves only when told to; waits wake on :meth:`advance` or a notify.

    Args:
        start_s: initial time in seconds.
    """

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s
        self._lock = threading.Lock()
        self._waiting: set[threading.Condition] = set()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake every waiter so it re-checks its deadline.

        Raises:
            ValueError: ``seconds`` is negative (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError(f"FakeClock.advance({seconds}): a monotonic clock cannot go back")
        with self._lock:
            self._now += seconds
            waiting = list(self._waiting)
        for condition in waiting:
            with condition:
                condition.notify_all()

    def wait_until(self, condition: threading.Condition, deadline_s: float | None) -> None:
        with self._lock:
            if deadline_s is not None and self._now >= deadline_s:
                return
            self._waiting.add(condition)  # registered before advance() can snapshot: no lost wake-up
        try:
            condition.wait()  # woken by notify (new work) or advance (time moved)
        finally:
            with self._lock:
                self._waiting.discard(condition)
