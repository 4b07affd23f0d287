"""Backoff schedule and retry loops, with a fake clock and sleep (no real waiting)."""

from __future__ import annotations

import asyncio
import random

import pytest

from fastpath_client.errors import (
    InvalidInputError,
    ModelRestartingError,
    ServerBusyError,
    ServerConnectionError,
    UnavailableError,
)
from fastpath_client.retry import NO_RETRY, Backoff, RetryPolicy, acall_with_retry, call_with_retry


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


def _busy():
    return ServerBusyError("Exceeds maximum queue size: 1024 texts queued + 64 in this request > max_queue_texts=1024")


def test_busy_answers_are_retried_until_the_call_deadline_not_max_attempts():
    """A full queue (ServerBusyError) is retried past max_attempts=3, with capped exponential delays,
    and no retry starts after the call's deadline (first attempt + 10 s)."""
    fake = FakeTime()
    call, calls = _flaky(1000, _busy())
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.5, max_backoff_s=2.0, jitter=0.0, deadline_s=None)
    with pytest.raises(ServerBusyError):
        call_with_retry(call, Backoff(policy, clock=fake.clock, call_deadline_s=fake.now + 10.0), sleep=fake.sleep)
    assert fake.sleeps == pytest.approx([0.5, 1.0, 2.0, 2.0, 2.0, 2.0])  # 9.5 s; one more 2 s would pass 10 s
    assert len(calls) == 7 and fake.now - 100.0 <= 10.0


def test_a_busy_answer_after_other_failures_still_waits_for_the_deadline():
    """Connection failures count towards max_attempts=3; busy answers in between do not."""
    fake = FakeTime()
    answers = [ServerConnectionError("refused"), _busy(), _busy(), ServerConnectionError("refused"), _busy()]

    def call():
        if answers:
            raise answers.pop(0)
        return "ok"

    backoff = Backoff(RetryPolicy(max_attempts=3, jitter=0.0), clock=fake.clock, call_deadline_s=fake.now + 60)
    assert call_with_retry(call, backoff, sleep=fake.sleep) == "ok"
    assert backoff.retries == 5 and backoff.counted == 2


def test_restarting_model_is_retried_until_the_deadline():
    fake = FakeTime()
    restarting = ModelRestartingError("Stub process 'text_embedding_0_0' is not healthy.")
    call, calls = _flaky(20, restarting)
    backoff = Backoff(RetryPolicy(max_attempts=2, max_backoff_s=0.5, jitter=0.0), clock=fake.clock,
                      call_deadline_s=fake.now + 30)
    assert call_with_retry(call, backoff, sleep=fake.sleep) == "ok" and len(calls) == 21


def test_no_retry_policy_never_retries_busy_answers():
    fake = FakeTime()
    call, calls = _flaky(5, _busy())
    with pytest.raises(ServerBusyError):
        call_with_retry(call, Backoff(NO_RETRY, clock=fake.clock, call_deadline_s=fake.now + 60), sleep=fake.sleep)
    assert len(calls) == 1 and fake.sleeps == []


def test_the_earlier_of_policy_deadline_and_call_deadline_wins():
    """deadline_s=5 after the first attempt and a call deadline 3 s away: no retry starts after 3 s."""
    fake = FakeTime()
    call, _ = _flaky(1000, _busy())
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=1.0, jitter=0.0, deadline_s=5.0)
    backoff = Backoff(policy, clock=fake.clock, call_deadline_s=fake.now + 3.0)
    with pytest.raises(ServerBusyError):
        call_with_retry(call, backoff, sleep=fake.sleep)
    assert fake.sleeps == [1.0, 1.0, 1.0] and backoff.remaining_s() == 0.0


def test_remaining_time_bounds_each_attempt():
    fake = FakeTime()
    backoff = Backoff(RetryPolicy(), clock=fake.clock, call_deadline_s=fake.now + 2.5)
    fake.now += 1.0
    assert backoff.remaining_s() == pytest.approx(1.5)
    assert Backoff(RetryPolicy(), clock=fake.clock).remaining_s() is None


def test_jitter_spreads_clients_that_fail_together():
    """Eight clients (seeded random sources) busy at once: their delays differ, each within
    [base * (1 - jitter), base] of the capped exponential schedule."""
    fake = FakeTime()
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.4, jitter=0.5)
    schedules = []
    for seed in range(8):
        backoff = Backoff(policy, clock=fake.clock, rng=random.Random(seed), call_deadline_s=fake.now + 60)
        schedules.append([backoff.next_delay_s(_busy()) for _ in range(5)])
    for schedule in schedules:
        for delay, base in zip(schedule, [0.1, 0.2, 0.4, 0.4, 0.4]):
            assert base * 0.5 <= delay <= base
    assert len({round(s[0], 9) for s in schedules}) == 8
