"""The scheduler's policy core: which texts run together, and when. Pure Python, no threads.

:class:`BatchQueue` holds accepted texts (:class:`~fastpath.scheduling.tickets.WorkItem`) in one
list per *length bucket*, each ordered by (priority level, arrival). Whenever the engine is free
(or about to be), the driver asks :meth:`BatchQueue.next_batch` for a :class:`Decision`: a batch to
run now, or the clock time to ask again. Time comes only from the ``now`` argument.

Candidates (:mod:`fastpath.scheduling.candidates`). A candidate batch is a run of adjacent length buckets ``[lo, hi]`` that holds the
*anchor* text; it pads to bucket ``hi``. Its size snaps to the engine's batch buckets: either down
(run the best-ranked ``B_down`` texts, the rest wait) or up (run all ``n`` texts plus
``B_up - n`` filler rows). The candidate with the highest *efficiency* wins: the ideal engine time
of its texts (their tokens at the per-token cost of a full largest batch) over the predicted time
of the padded batch, both from the cost model's uncontended *floor*
(:class:`~fastpath.scheduling.costs.CostModel`); deadlines use its *expected* times. So "pad the
length up or run two batches" and "pad the batch up or let texts wait" are both decided by cost. A
run of several buckets must also beat running each of its buckets' texts as their own batch, so a
short anchor never rides along with long texts that would run efficiently without it.

Rules, checked in this order while the engine is free:
    expire    texts past their Triton timeout leave the queue (answered UNAVAILABLE), unless
              another text of their request already ran (the timeout covers the wait before execution).
              The driver also calls :meth:`BatchQueue.expire` at :meth:`BatchQueue.next_expiry_s`
              while every engine is busy, so the answer comes at the timeout, not at the next batch.
    deadline  (b) if a text's batch must start before the batch the rules below would run now could
              end (its predicted cost; the engine asks again only then), given the predicted cost of
              its own batch plus ``deadline_margin_s``, its best batch runs now instead.
    full      (a) a length bucket holds a full largest batch bucket: that batch runs now; unless the
              oldest text has waited ``max_queue_delay_s`` (then ``delay`` goes first, so a bucket
              refilled by sustained load cannot starve other lengths), and only a bucket whose head
              has the head's priority level.
    drain     the queue is closed: run the best batch now.
    delay     (c) the oldest text has waited ``max_queue_delay_s``: the best batch runs now.
    idle      the engine is free and waiting is not predicted to pay: at arrival rate ``r`` into the
              candidate's buckets, filling the next batch bucket idles the engine ``need / r`` s; wait
              only if the fuller batch's efficiency, that idle time counted, beats running now by
              ``min_padding_gain``. Rates are learned only while work is pending, so a closed-loop
              client at concurrency 1 never waits for company (rarely pays on CPU; often on a GPU).
Within one priority level every text becomes the head in turn, so none waits behind later ones
for longer than the batches ahead of it take; a worse level can wait as long as better levels keep
the engine busy (Triton's priority semantics; give such requests a timeout).
The anchor is the queue head (best priority level, then oldest), except for ``deadline``: the text at risk.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence

from fastpath.errors import UnavailableError
from fastpath.scheduling.batch import Batch, Decision
from fastpath.scheduling.candidates import Candidate, CandidateRanking, rank_key
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.rates import ArrivalRate
from fastpath.scheduling.tickets import WorkItem

_MIN_WAIT_S = 50e-6  # waiting less than this is not worth a wake-up


class BatchQueue(CandidateRanking):
    """Bounded, length-bucketed queue with cost-based batch formation. Not thread-safe: the driver
    (:class:`~fastpath.scheduling.runner.BatchRunner`) serializes calls under its lock.

    Args:
        batch_buckets: strictly increasing batch sizes starting at 1; the last is the largest batch.
        length_buckets: strictly increasing padded lengths in tokens; a text of ``t`` tokens joins
            the first bucket >= ``t`` (the last bucket if none).
        costs: the shared cost model.
        max_queue_delay_s: rule (c), seconds.
        max_texts: queue bound in texts (rejects beyond it with UnavailableError).
        deadline_margin_s: rule (b) slack, seconds.
        min_padding_gain: extra padding (a wider length range, filler rows) or waiting must promise
            at least this factor more efficiency than the plain choice; predictions are noisy on a
            shared machine, and a coin-flip "gain" would only buy padding.
        pad_to_longest: a batch pads to its longest text instead of up to its length bucket. For
            engines that run any shape at the same speed per token (ONNX Runtime on the CPU: no
            CUDA graphs or optimization profiles to match); buckets still group texts of similar
            length. Off: every batch has a bucket length (or its longest text, beyond the last).

    Raises:
        ValueError: bucket lists are empty, unsorted, or batch buckets do not start at 1.
    """

    def __init__(self, *, batch_buckets: Sequence[int], length_buckets: Sequence[int], costs: CostModel,
                 max_queue_delay_s: float, max_texts: int, deadline_margin_s: float = 0.0,
                 min_padding_gain: float = 1.1, pad_to_longest: bool = False) -> None:
        for name, values in (("batch_buckets", batch_buckets), ("length_buckets", length_buckets)):
            if not values or list(values) != sorted(set(values)) or values[0] < 1:
                raise ValueError(f"{name} must be strictly increasing positive integers, got {list(values)}")
        if batch_buckets[0] != 1:
            raise ValueError(f"batch_buckets must start at 1 so any single text can run, got {list(batch_buckets)}")
        self.batch_buckets = tuple(batch_buckets)
        self.length_buckets = tuple(length_buckets)
        self.max_batch = self.batch_buckets[-1]
        self.costs = costs
        self.max_queue_delay_s = max_queue_delay_s
        self.max_texts = max_texts
        self.deadline_margin_s = deadline_margin_s
        self.min_padding_gain = min_padding_gain
        self.pad_to_longest = pad_to_longest
        self._groups: list[list[WorkItem]] = [[] for _ in self.length_buckets]
        self._rates = [ArrivalRate() for _ in self.length_buckets]
        self._count = 0
        self._seq = 0
        self._closed = False
        self._deadlines: list[tuple[float, int, WorkItem]] = []  # min-heap of queued texts' deadlines (lazy removal)

    unit = "texts"  # what the queue holds, for messages

    def __len__(self) -> int:
        return self._count

    @property
    def closed(self) -> bool:
        return self._closed

    def group_of(self, tokens: int) -> int:
        """Index of the length bucket a text of ``tokens`` tokens joins."""
        return min(bisect.bisect_left(self.length_buckets, tokens), len(self.length_buckets) - 1)

    def bucket_of(self, item: WorkItem) -> int:
        """Index of the bucket ``item`` joins: by token count here (``ShapeBatchQueue``: by exact shape)."""
        return self.group_of(item.tokens)

    def submit(self, items: Sequence[WorkItem], now: float, *, engine_busy: bool = False) -> None:
        """Accept all ``items`` (one request's texts) or none: every check (room, each item's bucket)
        runs before the queue changes, so a refused request leaves no item behind and the count
        always equals the items held.

        Args:
            items: the request's texts.
            now: clock time of arrival.
            engine_busy: whether a batch is running or staged. Arrival rates are learned only from
                texts that arrive while work is pending (queued or running): a closed-loop client
                at concurrency 1 never sends while it waits, so its gaps must not suggest that
                waiting would bring company.

        Raises:
            UnavailableError: the queue is closed, or the texts do not fit in ``max_texts``
                (Triton's wording: "Exceeds maximum queue size"); retryable.
        """
        self.check_room(len(items))
        groups = [self.bucket_of(item) for item in items]  # everything that can raise runs before the first change
        pending = engine_busy or self._count > 0
        per_group: dict[int, int] = {}
        for item, group in zip(items, groups):
            item.seq = self._seq
            self._seq += 1
            bisect.insort(self._groups[group], item, key=rank_key)
            if item.deadline_s is not None:
                heapq.heappush(self._deadlines, (item.deadline_s, item.seq, item))
            per_group[group] = per_group.get(group, 0) + 1
        for group, texts in per_group.items():
            if pending:
                self._rates[group].arrive(now, texts)
        self._count += len(items)

    def check_room(self, count: int) -> None:
        """Raise what :meth:`submit` would for ``count`` more texts (call it before costly preparation).

        Raises:
            UnavailableError: the queue is closed, or ``count`` more would exceed ``max_texts``.
        """
        if self._closed:
            raise UnavailableError("the model is shutting down and accepts no new requests; retry on another instance")
        if self._count + count > self.max_texts:
            raise UnavailableError(
                f"Exceeds maximum queue size: {self._count} {self.unit} queued + {count} in this request > "
                f"max_queue_texts={self.max_texts}; the server is overloaded, retry later (parameter max_queue_texts)"
            )

    def close(self) -> None:
        """Refuse new texts; queued ones are dispatched without waiting (rule ``drain``)."""
        self._closed = True

    def remove_all(self) -> list[WorkItem]:
        """Take every queued text out (for a drain that ran out of time)."""
        items = [item for group in self._groups for item in group]
        self._groups = [[] for _ in self.length_buckets]
        self._count = 0
        self._deadlines = []
        return items

    def next_batch(self, now: float, *, flush: bool = False) -> Decision:
        """Decide, for a free engine, what runs now; see the module docstring for the rules.

        ``flush``: no more texts will come before this batch runs, so the best batch runs now
        (rule ``drain``) instead of waiting for company.
        """
        expired = self._expire(now)
        if not self._count:
            return Decision(None, expired, None)
        if self._count == 1 and (flush or self._closed):
            return Decision(self._form_lone(now), expired)
        head = self._head()
        oldest_s = min(item.arrival_s for group in self._groups for item in group)
        pick = self._pick(head, oldest_s, now, flush)
        waiting = isinstance(pick, float)
        # deadline: a text whose batch must start before the picked batch would end (when this engine
        # asks next) runs now instead; while the engine waits, the driver asks again at its risk time.
        horizon_s = 0.0 if waiting else self.costs.estimate(pick[0].size, self.length_buckets[pick[0].hi])
        for anchor in self._deadline_risks(now + horizon_s):
            return Decision(self._form(self._best(anchor), anchor, "deadline", now), expired)
        if waiting:
            return Decision(None, expired, min(pick, oldest_s + self.max_queue_delay_s, self._next_risk_s()))
        return Decision(self._form(*pick, now), expired)

    def _pick(self, head: WorkItem, oldest_s: float, now: float, flush: bool) -> tuple[Candidate, WorkItem, str] | float:
        """(candidate, anchor, rule) by the rules after ``deadline``, or the clock time worth waiting until (rule ``idle``).

        ``full`` yields to ``delay``: once the oldest text has waited ``max_queue_delay_s``, the
        head's batch runs even while another bucket holds a full batch, and ``full`` runs only a
        bucket whose head has the head's priority level. Otherwise a bucket refilled to 64 texts by
        sustained load would run every time, and a lone text of another length (or of a better
        priority level) would wait until the load stopped (41 s under 8 clients).
        """
        overdue = now - oldest_s >= self.max_queue_delay_s
        if not overdue:
            full = self._full_group(head.priority_level)
            if full is not None:
                return self._single(full), self._groups[full][0], "full"
        best = self._best(head)
        if self._closed or flush:
            return best, head, "drain"
        if overdue:
            return best, head, "delay"
        wait_until = self._worth_waiting(best, now, oldest_s)
        return (best, head, "idle") if wait_until is None else wait_until

    # -- rules -------------------------------------------------------------------------------

    def _expire(self, now: float) -> tuple[WorkItem, ...]:
        """Remove texts whose ticket is already answered (dropped) or whose timeout passed (returned).

        A request's timeout covers its wait before execution starts, as in Triton: once one of its
        texts has been dispatched (``ticket.started``), its other texts no longer expire.
        """
        expired: list[WorkItem] = []
        for index, group in enumerate(self._groups):
            if not group or not any(item.ticket.done or self._timed_out(item, now) for item in group):
                continue
            keep = []
            for item in group:
                if item.ticket.done:
                    continue
                if self._timed_out(item, now):
                    expired.append(item)
                else:
                    keep.append(item)
            self._count -= len(group) - len(keep)
            self._groups[index] = keep
        while self._deadlines and self._deadlines[0][0] <= now:  # expired now, or dispatched: never again
            heapq.heappop(self._deadlines)
        return tuple(expired)

    @staticmethod
    def _timed_out(item: WorkItem, now: float) -> bool:
        return item.deadline_s is not None and item.deadline_s <= now and not item.ticket.started

    def _risk_s(self, item: WorkItem) -> float:
        """Latest clock time ``item``'s batch can start and still end ``deadline_margin_s`` before its deadline."""
        group = self.bucket_of(item)
        size = self.snap_up(min(len(self._groups[group]), self.max_batch))
        return item.deadline_s - self.costs.estimate(size, self.length_buckets[group]) - self.deadline_margin_s

    def _deadline_risks(self, by_s: float) -> Iterable[WorkItem]:
        """The text that must start by clock time ``by_s`` to meet its deadline (the most urgent), if any."""
        risks = [(self._risk_s(item), item.seq, item) for group in self._groups for item in group
                 if item.deadline_s is not None]
        return [item for risk_s, _, item in sorted(risks, key=lambda r: r[:2]) if risk_s <= by_s][:1]

    def next_expiry_s(self) -> float:
        """Clock time the next queued text times out (``inf`` if none can): when the driver should
        call :meth:`expire` even while every engine is busy, so a timed-out request is answered near its
        timeout, not at the next batch (which can be 1.4 s later under load)."""
        heap = self._deadlines
        while heap and (heap[0][2].ticket.started or heap[0][2].ticket.done):
            heapq.heappop(heap)  # dispatched or answered: its texts no longer expire
        return heap[0][0] if heap else float("inf")

    def expire(self, now: float) -> tuple[WorkItem, ...]:
        """Take out the texts whose timeout passed (and those of answered requests); returns the expired ones."""
        return self._expire(now)

    def _next_risk_s(self) -> float:
        times = [self._risk_s(item) for group in self._groups for item in group if item.deadline_s is not None]
        return min(times, default=float("inf"))

    def _full_group(self, level: int) -> int | None:
        """The length bucket with a full largest batch whose head ranks best, if any; only buckets
        whose head has priority ``level`` (a better-priority text elsewhere must not wait behind them)."""
        full = [index for index, group in enumerate(self._groups)
                if len(group) >= self.max_batch and group[0].priority_level == level]
        return min(full, key=lambda index: rank_key(self._groups[index][0]), default=None)

    def _head(self) -> WorkItem:
        return min((group[0] for group in self._groups if group), key=rank_key)

    def _worth_waiting(self, best: Candidate, now: float, oldest_s: float) -> float | None:
        """Clock time worth waiting until for more texts, or None to run ``best`` now.

        Waiting ``fill_s`` for the next batch bucket idles the engine that long; it pays only if
        the fuller batch's efficiency, idle time included, beats running ``best`` now.
        """
        larger = [size for size in self.batch_buckets if size > best.served]
        if not larger or best.in_range >= larger[0]:
            return None  # already the largest batch, or the cost model chose to leave texts waiting
        target = larger[0]
        rate = sum(self._rates[g].per_s(now) for g in range(best.lo, best.hi + 1))
        if rate <= 0:
            return None
        fill_s = max((target - best.in_range) / rate, _MIN_WAIT_S)
        if now + fill_s > oldest_s + self.max_queue_delay_s:
            return None
        useful_s = best.useful_s / best.served * target
        cost_s = fill_s + self.costs.estimate(target, self.length_buckets[best.hi], floor=True)
        return now + fill_s if useful_s / cost_s > best.efficiency * self.min_padding_gain else None

    def _form_lone(self, now: float) -> Batch:
        """The batch of the only queued text when it runs now regardless (flush or drain): what the
        rules would form (one row at its own length; no candidate to compare), without ranking
        candidates over every length bucket. It is the c=1 inline path's whole plan (~50 us saved
        per request on the dev machine, docs/benchmarks/scheduler_cpu.md)."""
        index = next(g for g, group in enumerate(self._groups) if group)
        item = self._groups[index].pop()
        self._count = 0
        item.ticket.started = True
        length = item.tokens if self.pad_to_longest else max(self.length_buckets[index], item.tokens)
        at_risk = item.deadline_s is not None and self._risk_s(item) <= now
        rule = "deadline" if at_risk else "full" if self.max_batch == 1 else "drain"
        return Batch((item,), 1, length, rule, now, self.costs.estimate(1, length))

    def _form(self, candidate: Candidate, anchor: WorkItem, rule: str, now: float) -> Batch:
        """Take the candidate's texts out of the queue: the anchor first, then by (priority, arrival)."""
        groups = [self._groups[g] for g in range(candidate.lo, candidate.hi + 1)]
        ranked = [anchor] + [item for item in heapq.merge(*groups, key=rank_key) if item is not anchor]
        chosen = ranked[: candidate.served]
        taken = {id(item) for item in chosen}
        for g in range(candidate.lo, candidate.hi + 1):
            self._groups[g] = [item for item in self._groups[g] if id(item) not in taken]
        self._count -= len(chosen)
        for item in chosen:
            item.ticket.started = True
        longest = max(item.tokens for item in chosen)
        length = longest if self.pad_to_longest else max(self.length_buckets[max(self.bucket_of(item) for item in chosen)], longest)
        size = max(candidate.size, len(chosen))
        return Batch(tuple(chosen), size, length, rule, now, self.costs.estimate(size, length))
