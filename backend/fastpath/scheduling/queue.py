"""The scheduler's queue: accepted items in buckets, and what every batch policy shares. Pure Python, no threads.

:class:`BatchQueue` holds accepted items (:class:`~fastpath.scheduling.tickets.WorkItem`) in one
:class:`~fastpath.scheduling.policy.ItemBucket` per bucket of its
:class:`~fastpath.scheduling.policy.BatchPolicy`, each ordered by (priority level, arrival). It
keeps the bookkeeping no policy may get wrong: the queue bound, a request taken whole or not at all,
timeouts, close and drain. Whenever the engine is free (or about to be), the driver asks
:meth:`BatchQueue.next_batch` for a :class:`~fastpath.scheduling.batch.Decision`: expired items
leave first (rule ``expire``), then the policy picks a batch to run now, or the clock time to ask
again. Time comes only from the ``now`` arguments.

expire: items past their Triton timeout leave the queue (answered UNAVAILABLE), unless another item
of their request already ran (the timeout covers the wait before execution). The driver also calls
:meth:`BatchQueue.expire` at :meth:`BatchQueue.next_expiry_s` while every engine is busy, so the
answer comes at the timeout, not at the next batch. Items of a request already answered (another of
its batches failed, it was cancelled) leave silently.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Hashable, Iterable, Sequence

from fastpath.errors import UnavailableError
from fastpath.scheduling.batch import Batch, Decision
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.policy import BatchPolicy, BucketSpec, ItemBucket
from fastpath.scheduling.tickets import Ticket, WorkItem, rank_key


class BatchQueue:
    """Bounded queue of items in the buckets of ``policy``. Not thread-safe: the driver
    (:class:`~fastpath.scheduling.runner.BatchRunner`) serializes calls under its lock.

    Args:
        policy: decides buckets and batches; owns the cost model (``queue.costs``).
        max_items: queue bound in items; a request that does not fit is refused whole (UnavailableError).
        unit: what an item is (``texts``, ``images``); messages name the bound ``max_queue_<unit>``.
    """

    def __init__(self, policy: BatchPolicy, *, max_items: int, unit: str = "texts") -> None:
        self.policy = policy
        self.max_items = max_items
        self.unit = unit
        self._buckets: dict[Hashable, ItemBucket] = {spec.key: ItemBucket(spec.key, spec.length) for spec in policy.buckets()}
        self._fixed = frozenset(self._buckets)  # the policy's own buckets: never forgotten
        self._count = 0
        self._seq = 0
        self._closed = False
        self._deadlines: list[tuple[float, int, WorkItem]] = []  # min-heap of (deadline_s, seq, item), lazy removal

    def __len__(self) -> int:
        return self._count

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def costs(self) -> CostModel:
        """The policy's cost model (the runner feeds it measured engine times)."""
        return self.policy.costs

    # -- what policies read ---------------------------------------------------------------------

    def buckets(self) -> list[ItemBucket]:
        """The buckets in creation order (the policy's own first); read-only for the caller."""
        return list(self._buckets.values())

    def bucket(self, key: Hashable) -> ItemBucket | None:
        """The bucket of ``key``, or None when it has none now."""
        return self._buckets.get(key)

    def bucket_keys(self) -> tuple[Hashable, ...]:
        """The keys that have a bucket now, in bucket order."""
        return tuple(self._buckets)

    def queued(self, key: Hashable) -> int:
        """Items of bucket ``key`` waiting now."""
        bucket = self._buckets.get(key)
        return 0 if bucket is None else len(bucket.items)

    def head(self) -> WorkItem:
        """The best-ranked queued item (priority level, then arrival); the queue must not be empty."""
        return min((bucket.items[0] for bucket in self._buckets.values() if bucket.items), key=rank_key)

    def take(self, items: Sequence[WorkItem], buckets: Iterable[ItemBucket]) -> list[ItemBucket]:
        """Take ``items`` (all queued in ``buckets``) out of the queue for a batch: their requests count as
        started (no more timeouts). Returns the buckets that gave items, in the order given."""
        taken = {id(item) for item in items}
        gave = []
        for bucket in buckets:
            kept = [item for item in bucket.items if id(item) not in taken]
            if len(kept) != len(bucket.items):
                gave.append(bucket)
                bucket.items = kept
        self._count -= len(items)
        for item in items:
            item.ticket.started = True
        return gave

    # -- what the driver calls ------------------------------------------------------------------

    def submit(self, items: Sequence[WorkItem], now: float, *, engine_busy: bool = False) -> None:
        """Accept all ``items`` (one request's) or none: every check (each item's bucket, room) runs
        before the queue changes, so a refused request leaves no item behind and the count always
        equals the items held.

        Args:
            items: the request's items.
            now: clock time of arrival.
            engine_busy: whether a batch is running or staged. Arrival rates are learned only from
                items that arrive while work is pending (queued or running): a closed-loop client
                at concurrency 1 never sends while it waits, so its gaps must not suggest that
                waiting would bring company.

        Raises:
            ValueError: the policy cannot hold an item, or it gives one bucket two cost lengths.
            UnavailableError: the queue is closed, or the items do not fit in ``max_items``
                (Triton's wording: "Exceeds maximum queue size"); retryable.
        """
        specs = [self.policy.bucket_of(item) for item in items]
        new = self._new_buckets(items, specs)
        self.check_room(len(items))
        self._make_buckets(new, keep={spec.key for spec in specs})
        pending = engine_busy or self._count > 0
        arrivals: dict[Hashable, int] = {}
        for item, spec in zip(items, specs):
            item.seq = self._seq
            self._seq += 1
            bisect.insort(self._buckets[spec.key].items, item, key=rank_key)
            if item.deadline_s is not None:
                heapq.heappush(self._deadlines, (item.deadline_s, item.seq, item))
            arrivals[spec.key] = arrivals.get(spec.key, 0) + 1
        if pending:
            for key, count in arrivals.items():
                self._buckets[key].rate.arrive(now, count)
        self._count += len(items)

    def _new_buckets(self, items: Sequence[WorkItem], specs: Sequence[BucketSpec]) -> dict[Hashable, int]:
        """The keys of ``specs`` without a bucket yet, with their cost lengths; checks every length
        against its bucket's (or the request's first of that key).

        Raises:
            ValueError: one key with two cost lengths.
        """
        new: dict[Hashable, int] = {}
        for item, spec in zip(items, specs):
            bucket = self._buckets.get(spec.key)
            known = bucket.length if bucket is not None else new.setdefault(spec.key, spec.length)
            if known != spec.length:
                raise ValueError(f"bucket {spec.key} has cost length {known}, got an item with tokens={item.tokens} "
                                 f"(cost length {spec.length}); every item of one bucket must have the same tokens")
        return new

    def _make_buckets(self, new: dict[Hashable, int], keep: set[Hashable]) -> None:
        """Add the buckets of ``new``; first, past ``max_idle_buckets``, forget every empty bucket not
        in ``keep`` (the request's own) and not the policy's. Nothing queued is touched."""
        if not new:
            return
        limit = self.policy.max_idle_buckets
        if limit is not None and len(self._buckets) + len(new) > limit:
            self._buckets = {key: bucket for key, bucket in self._buckets.items()
                             if bucket.items or key in keep or key in self._fixed}
        for key, length in new.items():
            self._buckets[key] = ItemBucket(key, length)

    def check_room(self, count: int) -> None:
        """Raise what :meth:`submit` would for ``count`` more items (call it before costly preparation).

        Raises:
            UnavailableError: the queue is closed, or ``count`` more would exceed ``max_items``.
        """
        if self._closed:
            raise UnavailableError("the model is shutting down and accepts no new requests; retry on another instance")
        if self._count + count > self.max_items:
            raise UnavailableError(
                f"Exceeds maximum queue size: {self._count} {self.unit} queued + {count} in this request > "
                f"max_queue_{self.unit}={self.max_items}; the server is overloaded, retry later (parameter max_queue_{self.unit})"
            )

    def waiting_tickets(self, arrived_by_s: float) -> list[Ticket]:
        """The distinct tickets with items queued that arrived by ``arrived_by_s``, none of their items dispatched
        and not answered, oldest first (the ones a full queue asks whether their client cancelled)."""
        tickets: dict[int, tuple[float, Ticket]] = {}
        for bucket in self._buckets.values():
            for item in bucket.items:
                ticket = item.ticket
                if item.arrival_s <= arrived_by_s and not (ticket.started or ticket.done):
                    tickets.setdefault(id(ticket), (item.arrival_s, ticket))
        return [ticket for _, ticket in sorted(tickets.values(), key=lambda pair: pair[0])]

    def drop_answered(self) -> None:
        """Take out the items whose ticket is already answered (e.g. cancelled while queued): their room is free."""
        self._take_out(None)

    def close(self) -> None:
        """Refuse new items; queued ones are dispatched without waiting (the policies' rule ``drain``)."""
        self._closed = True

    def remove_all(self) -> list[WorkItem]:
        """Take every queued item out (for a drain that ran out of time)."""
        items = [item for bucket in self._buckets.values() for item in bucket.items]
        for bucket in self._buckets.values():
            bucket.items = []
        self._count = 0
        self._deadlines = []
        return items

    def next_batch(self, now: float, *, flush: bool = False) -> Decision:
        """Decide, for a free engine, what runs now: expire, then ask the policy.

        ``flush``: no more items will come before this batch runs, so the policy runs its best
        batch now instead of waiting for company.
        """
        expired = self._expire(now)
        if not self._count:
            return Decision(batch=None, expired=expired)
        choice = self.policy.next_batch(self, now, flush=flush)
        if isinstance(choice, Batch):
            return Decision(batch=choice, expired=expired)
        return Decision(batch=None, expired=expired, wake_s=choice)

    def expire(self, now: float) -> tuple[WorkItem, ...]:
        """Take out the items whose timeout passed (and those of answered requests); returns the expired ones."""
        return self._expire(now)

    def next_expiry_s(self) -> float:
        """Clock time the next queued item times out (``inf`` if none can): when the driver should
        call :meth:`expire` even while every engine is busy, so a timed-out request is answered near its
        timeout, not at the next batch (which can be 1.4 s later under load)."""
        heap = self._deadlines
        while heap:
            deadline_s, _, item = heap[0]
            if not (item.ticket.started or item.ticket.done):
                return deadline_s
            heapq.heappop(heap)  # dispatched or answered: its items no longer expire
        return float("inf")

    def _expire(self, now: float) -> tuple[WorkItem, ...]:
        """Remove items whose ticket is already answered (dropped) or whose timeout passed (returned).

        A request's timeout covers its wait before execution starts, as in Triton: once one of its
        items has been dispatched (``ticket.started``), its other items no longer expire.
        """
        expired = self._take_out(now)
        heap = self._deadlines
        while heap and heap[0][0] <= now:  # the earliest deadline passed: expired now, or dispatched: never again
            heapq.heappop(heap)
        return expired

    def _take_out(self, now: float | None) -> tuple[WorkItem, ...]:
        """Drop the items whose ticket is answered and, unless ``now`` is None, take out and return those timed out."""
        expired: list[WorkItem] = []
        for bucket in self._buckets.values():
            if not bucket.items or not any(item.ticket.done or (now is not None and _timed_out(item, now)) for item in bucket.items):
                continue
            keep = []
            for item in bucket.items:
                if item.ticket.done:
                    continue
                if now is not None and _timed_out(item, now):
                    expired.append(item)
                else:
                    keep.append(item)
            self._count -= len(bucket.items) - len(keep)
            bucket.items = keep
        return tuple(expired)


def _timed_out(item: WorkItem, now: float) -> bool:
    return item.deadline_s is not None and item.deadline_s <= now and not item.ticket.started
