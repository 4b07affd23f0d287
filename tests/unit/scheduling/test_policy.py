"""A new batch policy is one class handed to ``BatchQueue``: "oldest first, fixed size" through the real
BatchQueue and BatchRunner on a fake clock, with the queue's shared rules (bound, timeouts) unchanged."""

from __future__ import annotations

import threading

import pytest

from fastpath.errors import UnavailableError
from fastpath.scheduling import (
    Batch,
    BatchPolicy,
    BatchQueue,
    BatchRunner,
    BucketSpec,
    CostModel,
    QueueTimeoutError,
    Ticket,
    WorkItem,
)

RUN_S = 1e-3  # fake engine time per batch


class OldestFirst(BatchPolicy):
    """Every item in one bucket; each batch is the ``size`` oldest items (all there are, when fewer),
    whatever their priority, in ``size`` rows padded to the longest item, run as soon as an engine is free."""

    def __init__(self, size: int, costs: CostModel) -> None:
        self.size = size
        self.costs = costs

    def bucket_of(self, item: WorkItem) -> BucketSpec:
        return BucketSpec("all", 0)

    def rows_for(self, count: int) -> int:
        return self.size

    def next_batch(self, queue: BatchQueue, now: float, *, flush: bool) -> Batch:
        bucket = queue.bucket("all")
        chosen = tuple(sorted(bucket.items, key=lambda item: item.seq)[: self.size])
        queue.take(chosen, [bucket])
        length = max(item.tokens for item in chosen)
        return Batch(items=chosen, batch_size=self.size, length=length, rule="oldest", formed_s=now,
                     predicted_s=self.costs.estimate(self.size, length))


class Engine:
    """The model side of the runner: records each batch, answers each item with its tokens."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.ran: list[Batch] = []
        self.lock = threading.Lock()

    def stage(self, batch: Batch) -> Batch:
        return batch

    def run(self, batch: Batch) -> list[int]:
        self.clock.advance(RUN_S)
        with self.lock:
            self.ran.append(batch)
        return [item.tokens for item in batch.items]

    def finish(self, batch: Batch, outputs: list[int]) -> None:
        for item, value in zip(batch.items, outputs):
            item.ticket.set_row(item.row, value)


def _request(answers, tokens: list[int], label: str, priority_level: int = 0) -> list[WorkItem]:
    ticket = Ticket(len(tokens), answers, label=label)
    return [WorkItem(ticket, row, count, priority_level=priority_level) for row, count in enumerate(tokens)]


def test_a_tiny_policy_runs_through_the_real_queue_and_runner(answers, clock):
    """Invariant: the runner runs whatever the policy forms, in its order (oldest first, priority
    ignored, three rows a batch), and every request, the timed-out and the refused included, is
    answered exactly once; the queue's bound and timeouts apply to any policy."""
    engine = Engine(clock)
    runner = BatchRunner(BatchQueue(OldestFirst(3, CostModel()), max_items=8), engine, clock=clock)
    requests = {"a": [5, 7], "b": [9], "c": [4, 4, 4], "urgent": [2]}
    items = {label: _request(answers, tokens, label, priority_level=1 if label == "urgent" else 2)
             for label, tokens in requests.items()}
    for request in items.values():
        runner.submit(request)
    late = _request(answers, [3], "late")
    runner.submit(late, timeout_s=1e-3)
    too_many = _request(answers, [1] * 2, "too many")
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size: 8 texts queued"):
        runner.submit(too_many)
    too_many[0].ticket.fail(UnavailableError("refused"))  # what the models do with a refusal
    clock.advance(2e-3)  # the late request times out before an engine ever asks
    runner.start()
    try:
        answers.wait_for(6)
    finally:
        runner.close(drain_timeout_s=10)
    assert [[item.ticket.label for item in batch.items] for batch in engine.ran] == [["a", "a", "b"], ["c", "c", "c"], ["urgent"]]
    assert {(batch.batch_size, batch.rule) for batch in engine.ran} == {(3, "oldest")}
    assert [batch.length for batch in engine.ran] == [9, 4, 2]
    assert all(answers.count(request[0].ticket) == 1 for request in (*items.values(), late, too_many))
    assert answers.of(items["c"][0].ticket) == ([4, 4, 4], None)
    assert isinstance(answers.of(late[0].ticket)[1], QueueTimeoutError)
