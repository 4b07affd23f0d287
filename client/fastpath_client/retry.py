"""Retries with exponential backoff for retryable errors (UNAVAILABLE, connection refused, model loading).

The delay before retry ``k`` (0-based) is ``min(max_backoff_s, initial_backoff_s * multiplier**k)``,
reduced by up to ``jitter`` of itself at random ("equal jitter"), so many clients that fail at once
do not come back at once. Retrying stops after ``max_attempts`` attempts, or when the next attempt
would start later than ``deadline_s`` after the first or after the call's own deadline (its
``timeout_s``), whichever comes first. Answers that say the server is busy or restarting
(``error.until_deadline``: a full queue, a model loading, a model instance being reloaded) do not count towards
``max_attempts``: they are retried until a deadline, unless retries are off (``max_attempts=1``).

Clocks, sleeps and the random source are injected so tests run without sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastpath_client.errors import FastPathClientError

T = TypeVar("T")
OnRetry = Callable[[int, FastPathClientError, float], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """When and how often a failed call is tried again.

    Attributes:
        max_attempts: attempts in all, the first included (1 disables retries).
        initial_backoff_s: delay before the first retry, seconds.
        max_backoff_s: cap on one delay, seconds.
        multiplier: growth of the delay per retry.
        jitter: fraction (0-1) of each delay removed at random.
        deadline_s: no retry starts later than this many seconds after the first attempt; None: no limit.
    """

    max_attempts: int = 6
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2
    deadline_s: float | None = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(f"RetryPolicy needs 0 <= initial_backoff_s <= max_backoff_s, got "
                             f"{self.initial_backoff_s} and {self.max_backoff_s}")
        if self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"RetryPolicy needs multiplier >= 1 and 0 <= jitter <= 1, got {self.multiplier}, {self.jitter}")

    def delay_s(self, retry_index: int, uniform: float) -> float:
        """Delay before retry ``retry_index`` (0-based), with ``uniform`` in [0, 1) from the random source."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**retry_index)
        return base * (1.0 - self.jitter * uniform)


NO_RETRY = RetryPolicy(max_attempts=1)


class Backoff:
    """The retry state of one call: decides, after each failure, whether and how long to wait.

    Args:
        policy: the retry policy.
        clock: monotonic clock in seconds.
        rng: source of ``random()`` values in [0, 1).
        call_deadline_s: reading of ``clock`` after which no retry starts (the call's timeout); None: only
            the policy's ``deadline_s`` applies.
    """

    def __init__(self, policy: RetryPolicy, *, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, call_deadline_s: float | None = None) -> None:
        self.policy = policy
        self._clock = clock
        self._rng = rng or random.Random()
        self._start = clock()
        self.call_deadline_s = self._deadline_s = call_deadline_s
        if policy.deadline_s is not None:
            policy_end = self._start + policy.deadline_s
            self._deadline_s = policy_end if call_deadline_s is None else min(call_deadline_s, policy_end)
        self.retries = 0
        self.counted = 0  # retries that count towards max_attempts

    def next_delay_s(self, error: FastPathClientError) -> float | None:
        """Seconds to wait before retrying after ``error``; None when the call should fail with it."""
        if not error.retryable or self.policy.max_attempts == 1:
            return None
        counts = not error.until_deadline
        if counts and self.counted + 1 >= self.policy.max_attempts:
            return None
        delay = self.policy.delay_s(self.retries, self._rng.random())
        if self._deadline_s is not None and self._clock() + delay > self._deadline_s:
            return None
        self.retries += 1
        self.counted += counts
        return delay

    def remaining_s(self) -> float | None:
        """Seconds left until the call's deadline (never below 0), the most the next attempt may take;
        None without a call deadline."""
        return None if self.call_deadline_s is None else max(self.call_deadline_s - self._clock(), 0.0)


def call_with_retry(call: Callable[[], T], backoff: Backoff, *, sleep: Callable[[float], None] = time.sleep,
                    on_retry: OnRetry | None = None) -> T:
    """Run ``call`` until it succeeds or ``backoff`` gives up; ``call`` raises FastPathClientError on failure.

    ``on_retry(retry_number, error, delay_s)`` is called before each wait (for logs and metrics).
    """
    while True:
        try:
            return call()
        except FastPathClientError as error:
            delay = backoff.next_delay_s(error)
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(backoff.retries, error, delay)
            sleep(delay)


async def acall_with_retry(call: Callable[[], Awaitable[T]], backoff: Backoff, *,
                           sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                           on_retry: OnRetry | None = None) -> T:
    """The awaitable form of :func:`call_with_retry`."""
    while True:
        try:
            return await call()
        except FastPathClientError as error:
            delay = backoff.next_delay_s(error)
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(backoff.retries, error, delay)
            await sleep(delay)
