"""Helpers for the scheduler's unit tests: a fake clock, linear cost models, and recorded tickets."""

from __future__ import annotations

import threading

import pytest

from fastpath.scheduling import BatchQueue, CostModel, FakeClock, LengthBucketPolicy, Ticket, WorkItem

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
LENGTH_BUCKETS = (16, 32, 64, 128, 256)

# Cost shapes measured on real engines, to first order: CPU (ONNX Runtime, 2 cores) is dominated by
# per-token work, a GPU by a per-call overhead.
CPU = dict(prior_overhead_s=2e-3, prior_per_token_s=1e-4)
GPU = dict(prior_overhead_s=5e-3, prior_per_token_s=1e-7)


class Answers:
    """Records every ticket answer; ``count(ticket)`` must end at exactly 1."""

    def __init__(self) -> None:
        self.calls: list[tuple[Ticket, list | None, BaseException | None]] = []
        self._lock = threading.Condition()

    def __call__(self, ticket, results, error) -> None:
        with self._lock:
            self.calls.append((ticket, results, error))
            self._lock.notify_all()

    def count(self, ticket: Ticket) -> int:
        return sum(1 for t, _, _ in self.calls if t is ticket)

    def of(self, ticket: Ticket):
        (answer,) = [(results, error) for t, results, error in self.calls if t is ticket]
        return answer

    def wait_for(self, total: int, timeout_s: float = 10.0) -> None:
        """Block until ``total`` answers arrived (an event wait, not a sleep); fail after ``timeout_s``."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.calls) >= total, timeout=timeout_s):
                raise AssertionError(f"{len(self.calls)} answers after {timeout_s} s, expected {total}")


@pytest.fixture
def answers() -> Answers:
    return Answers()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_queue(costs: dict = CPU, *, max_queue_delay_s: float = 2e-3, max_texts: int = 1024,
               deadline_margin_s: float = 0.0, batch_sizes=BATCH_BUCKETS, length_buckets=LENGTH_BUCKETS,
               min_padding_gain: float = 1.0, pad_to_longest: bool = False) -> BatchQueue:
    """A queue of texts under the length-bucket policy, as text_embedding's sender mode builds it."""
    policy = LengthBucketPolicy(batch_sizes=batch_sizes, length_buckets=length_buckets, costs=CostModel(0.2, **costs),
                                max_queue_delay_s=max_queue_delay_s, deadline_margin_s=deadline_margin_s,
                                min_padding_gain=min_padding_gain, pad_to_longest=pad_to_longest)
    return BatchQueue(policy, max_items=max_texts)


def request(answers, tokens: list[int], *, priority_level: int = 0, cancelled=None, label: str = "") -> list[WorkItem]:
    """One request's work items (one per token length), sharing a ticket that reports to ``answers``."""
    ticket = Ticket(len(tokens), answers, is_cancelled=cancelled, label=label)
    return [WorkItem(ticket, row, t, payload=f"{label}#{row}", priority_level=priority_level) for row, t in enumerate(tokens)]


def submit(queue: BatchQueue, clock: FakeClock, items: list[WorkItem], timeout_s: float | None = None,
           engine_busy: bool = False) -> list[WorkItem]:
    """What BatchRunner.submit does, without threads: stamp arrival/deadline and queue."""
    now = clock.now()
    for item in items:
        item.arrival_s = now
        item.deadline_s = now + timeout_s if timeout_s else None
    queue.submit(items, now, engine_busy=engine_busy)
    return items
