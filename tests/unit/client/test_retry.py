"""Backoff schedule and retry loops, with a fake clock and sleep (no real waiting)."""

from __future__ import annotations

import asyncio
import random

import pytest

from fastpath_client.errors import InvalidInputError, UnavailableError
from fastpath_client.retry import Backoff, RetryPolicy, acall_with_retry, call_with_retry


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds):
        self.sleep(seconds)


def _flaky(failures, error=UnavailableError("503 from server: loading")):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "ok"

    return call, calls


def test_delays_grow_exponentially_and_are_capped():
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.5, multiplier=2.0, jitter=0.0)
    assert [policy.delay_s(k, 0.7) for k in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])


def test_jitter_removes_up_to_its_fraction():
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=1.0, jitter=0.25)
    assert policy.delay_s(0, 0.0) == 1.0 and policy.delay_s(0, 0.999) == pytest.approx(0.75025)


def test_retries_unavailable_until_success():
    fake = FakeTime()
    call, calls = _flaky(3)
    seen = []
    backoff = Backoff(RetryPolicy(jitter=0.0), clock=fake.clock)
    result = call_with_retry(call, backoff, sleep=fake.sleep, on_retry=lambda n, e, d: seen.append((n, d)))
    assert result == "ok" and len(calls) == 4
    assert fake.sleeps == pytest.approx([0.05, 0.1, 0.2]) and [n for n, _ in seen] == [1, 2, 3]


def test_invalid_input_is_not_retried():
    fake = FakeTime()
    call, calls = _flaky(1, InvalidInputError("400: bad"))
    with pytest.raises(InvalidInputError):
        call_with_retry(call, Backoff(RetryPolicy(), clock=fake.clock), sleep=fake.sleep)
    assert len(calls) == 1 and fake.sleeps == []


def test_gives_up_after_max_attempts_with_the_last_error():
    fake = FakeTime()
    call, calls = _flaky(10)
    with pytest.raises(UnavailableError, match="loading"):
        call_with_retry(call, Backoff(RetryPolicy(max_attempts=3), clock=fake.clock), sleep=fake.sleep)
    assert len(calls) == 3


def test_deadline_stops_retrying():
    fake = FakeTime()
    call, calls = _flaky(100)
    policy = RetryPolicy(max_attempts=1000, initial_backoff_s=1.0, max_backoff_s=1.0, jitter=0.0, deadline_s=5.5)
    with pytest.raises(UnavailableError):
        call_with_retry(call, Backoff(policy, clock=fake.clock), sleep=fake.sleep)
    assert len(calls) == 6 and fake.now - 100.0 == pytest.approx(5.0)


def test_async_retry_has_the_same_schedule():
    fake = FakeTime()
    call, calls = _flaky(2)

    async def acall():
        return call()

    backoff = Backoff(RetryPolicy(jitter=0.2), clock=fake.clock, rng=random.Random(1))
    assert asyncio.run(acall_with_retry(acall, backoff, sleep=fake.asleep)) == "ok"
    assert len(calls) == 3 and len(fake.sleeps) == 2 and 0.04 <= fake.sleeps[0] <= 0.05


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"initial_backoff_s": 3.0, "max_backoff_s": 1.0}, {"jitter": 2.0}])
def test_bad_policies_are_refused(kwargs):
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**kwargs)
