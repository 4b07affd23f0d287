"""Property-based tests of both scheduler queues: any sequence of operations keeps their bookkeeping true.

Hypothesis drives random sequences of submits (random shapes or lengths, random sizes, with and without
timeouts), batch takes, clock steps, cancellations, expiries, closes and drains against a
a :class:`BatchQueue` under the :class:`ExactShapePolicy` (over many more distinct shapes than
``max_idle_shapes``, so idle buckets are forgotten all the time) and one under the
:class:`LengthBucketPolicy`. After every step:

* ``len(queue)`` equals the items its buckets hold, and equals the items accepted and not yet taken
  out (by a batch, an expiry or a drain), counted independently here;
* a refused submit (queue full, closed) left none of its items in the queue;
* the bucket table agrees with itself, every queued item sits in the bucket of its key, and idle
  shape buckets are forgotten (the table stays bounded while hundreds of shapes pass through);
* a batch holds items of one shape (``ExactShapePolicy``), never more than ``batch_size`` of them;
* no ticket was answered twice.

At teardown the queue is closed and drained as the runner does, and every request that was offered
(accepted or refused) has exactly one answer.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fastpath.errors import UnavailableError
from fastpath.scheduling import BatchQueue, CostModel, ExactShapePolicy, FakeClock, LengthBucketPolicy, Ticket, WorkItem

from .conftest import CPU, GPU

SHAPES = [(736, 736 + 32 * k) for k in range(100)] + [(32 * h, 32 * w) for h in range(1, 11) for w in range(1, 11)]
MAX_IDLE_SHAPES = 6  # far fewer than the shapes drawn: eviction runs on most submits
MAX_ITEMS = 24
PROPERTY_SETTINGS = settings(max_examples=150, stateful_step_count=60, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


def _queued(queue: BatchQueue) -> list[WorkItem]:
    return [item for bucket in queue.buckets() for item in bucket.items]


class _Answers:
    """Counts answers per ticket; the test fails on the first second answer."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}

    def __call__(self, ticket: Ticket, results, error) -> None:
        self.count[id(ticket)] = self.count.get(id(ticket), 0) + 1
        assert self.count[id(ticket)] == 1, f"ticket {ticket.label} answered {self.count[id(ticket)]} times"


class QueueMachine(RuleBasedStateMachine):
    """Shared rules; subclasses make the queue and the items."""

    def make_queue(self, costs: dict) -> BatchQueue:
        raise NotImplementedError

    def make_items(self, ticket: Ticket, keys: list) -> list[WorkItem]:
        raise NotImplementedError

    @initialize(costs=st.sampled_from([CPU, GPU]), delay_s=st.sampled_from([0.0, 2e-3]))
    def start(self, costs: dict, delay_s: float) -> None:
        self.clock = FakeClock()
        self.answers = _Answers()
        self.queue = self.make_queue(costs, delay_s)
        self.tickets: list[Ticket] = []
        self.held: dict[int, WorkItem] = {}  # id -> item accepted and still queued, by this model of the queue

    # -- operations ----------------------------------------------------------------------------

    def _offer(self, keys: list, timeout_s: float | None) -> None:
        ticket = Ticket(len(keys), self.answers, label=f"r{len(self.tickets)}")
        self.tickets.append(ticket)
        items = self.make_items(ticket, keys)
        now = self.clock.now()
        for item in items:
            item.arrival_s = now
            item.deadline_s = now + timeout_s if timeout_s else None
        before = len(self.queue)
        try:
            self.queue.submit(items, now, engine_busy=bool(self.held))
        except UnavailableError as exc:
            assert len(self.queue) == before, "a refused request changed the queue's count"
            assert not any(item in _queued(self.queue) for item in items), "a refused request left items behind"
            ticket.fail(exc)  # what the models do: the refusal is the request's one answer
            return
        self.held.update((id(item), item) for item in items)

    @rule(data=st.data(), timeout_s=st.sampled_from([None, 1e-3, 5e-3]))
    def submit(self, data, timeout_s) -> None:
        raise NotImplementedError

    @rule()
    def take(self) -> None:
        decision = self.queue.next_batch(self.clock.now())
        self._answer_expired(decision.expired)
        batch = decision.batch
        if batch is None:
            return
        assert 1 <= len(batch.items) <= batch.batch_size
        self._check_batch(batch)
        for item in batch.items:
            assert self.held.pop(id(item), None) is item, "a batch took an item the queue did not hold"
            item.ticket.set_row(item.row, item.payload)

    @rule(seconds=st.sampled_from([1e-4, 1e-3, 4e-3]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(data=st.data())
    @precondition(lambda self: self.tickets)
    def cancel(self, data) -> None:
        data.draw(st.sampled_from(self.tickets)).fail(RuntimeError("cancelled"))

    @rule()
    def expire(self) -> None:
        self._answer_expired(self.queue.expire(self.clock.now()))

    @rule()
    def close(self) -> None:
        self.queue.close()

    @rule()
    def remove_all(self) -> None:
        removed = self.queue.remove_all()
        assert {id(item) for item in removed} == set(self.held)
        self.held.clear()
        for item in removed:
            item.ticket.fail(RuntimeError("drain timed out"))

    def _answer_expired(self, expired) -> None:
        for item in expired:
            # an expired item is either timed out, or of a ticket answered already (dropped silently)
            assert self.held.pop(id(item), None) is item
            item.ticket.fail(RuntimeError("timeout"))
        for key, item in list(self.held.items()):  # answered tickets' items may leave at any expiry pass
            if item.ticket.done and not any(item is queued for queued in _queued(self.queue)):
                del self.held[key]

    def _check_batch(self, batch) -> None:
        pass

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def counts_equal_items_held(self) -> None:
        queued = _queued(self.queue)
        assert len(self.queue) == len(queued) >= 0
        assert {id(item) for item in queued} == set(self.held)
        buckets = self.queue.buckets()
        assert self.queue.bucket_keys() == tuple(bucket.key for bucket in buckets)
        for bucket in buckets:
            assert self.queue.bucket(bucket.key) is bucket
            for item in bucket.items:
                assert self.queue.policy.bucket_of(item) == (bucket.key, bucket.length)

    def teardown(self) -> None:
        if not hasattr(self, "queue"):
            return
        self.queue.close()
        for _ in range(10 * MAX_ITEMS):
            if not len(self.queue):
                break
            self.take()
        assert len(self.queue) == 0
        for ticket in self.tickets:
            assert self.answers.count.get(id(ticket)) == 1, f"{ticket.label} has {self.answers.count.get(id(ticket), 0)} answers"


class ShapeQueueMachine(QueueMachine):
    def make_queue(self, costs: dict, delay_s: float) -> BatchQueue:
        policy = ExactShapePolicy(batch_sizes=(1, 2, 4, 8), costs=CostModel(0.2, **costs), max_queue_delay_s=delay_s,
                                  min_padding_gain=1.0, max_idle_shapes=MAX_IDLE_SHAPES)
        return BatchQueue(policy, max_items=MAX_ITEMS, unit="images")

    def make_items(self, ticket: Ticket, keys: list) -> list[WorkItem]:
        return [WorkItem(ticket, row, (h // 32) * (w // 32), payload=(h, w), shape=(h, w)) for row, (h, w) in enumerate(keys)]

    @rule(data=st.data(), timeout_s=st.sampled_from([None, 1e-3, 5e-3]))
    def submit(self, data, timeout_s) -> None:
        # recently used shapes often (their buckets may be empty and evictable), new ones too
        pool = st.sampled_from(SHAPES[:12]) | st.sampled_from(SHAPES)
        self._offer(data.draw(st.lists(pool, min_size=1, max_size=10)), timeout_s)

    def _check_batch(self, batch) -> None:
        assert len({item.shape for item in batch.items}) == 1, "a batch mixed shapes"

    @invariant()
    def idle_shapes_are_forgotten(self) -> None:
        # a new shape past MAX_IDLE_SHAPES buckets drops the empty ones, leaving at most one per queued item
        assert len(self.queue.buckets()) <= max(MAX_IDLE_SHAPES, MAX_ITEMS)


class LengthQueueMachine(QueueMachine):
    def make_queue(self, costs: dict, delay_s: float) -> BatchQueue:
        policy = LengthBucketPolicy(batch_sizes=(1, 2, 4, 8, 16), length_buckets=(16, 32, 64, 128, 256),
                                    costs=CostModel(0.2, **costs), max_queue_delay_s=delay_s, min_padding_gain=1.0)
        return BatchQueue(policy, max_items=MAX_ITEMS)

    def make_items(self, ticket: Ticket, keys: list) -> list[WorkItem]:
        return [WorkItem(ticket, row, tokens, payload=tokens) for row, tokens in enumerate(keys)]

    @rule(data=st.data(), timeout_s=st.sampled_from([None, 1e-3, 5e-3]))
    def submit(self, data, timeout_s) -> None:
        self._offer(data.draw(st.lists(st.integers(1, 400), min_size=1, max_size=12)), timeout_s)


TestShapeBatchQueueProperties = ShapeQueueMachine.TestCase
TestShapeBatchQueueProperties.settings = PROPERTY_SETTINGS
TestBatchQueueProperties = LengthQueueMachine.TestCase
TestBatchQueueProperties.settings = PROPERTY_SETTINGS
