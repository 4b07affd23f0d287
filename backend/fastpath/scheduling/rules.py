"""The cost rules: which queued items run together, and when, decided by the cost model.

:class:`CostRules` is the :class:`~fastpath.scheduling.policy.BatchPolicy` behind
:class:`~fastpath.scheduling.lengths.LengthBucketPolicy` (texts) and
:class:`~fastpath.scheduling.shapes.ExactShapePolicy` (images); they differ only in their buckets and in
whether neighbouring buckets may merge (``merges_buckets``). Candidates (:mod:`fastpath.scheduling.candidates`)
are runs of adjacent buckets holding the anchor item (the queue head; for ``deadline``, the item at risk),
snapped down or up to an engine batch size; the most efficient wins (the items' ideal engine time over the
padded batch's predicted time, on :class:`~fastpath.scheduling.costs.CostModel`'s floor), so padding,
merging and waiting are all decided by cost.

Rules, in order, while the engine is free (after the queue's ``expire``): ``deadline`` (b), ``full`` (a),
``drain``, ``delay`` (c), ``idle``. What each does, and why this order keeps every item of a priority
level from waiting behind later ones: docs/design/scheduler.md ("The cost rules").
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from fastpath.scheduling.batch import Batch
from fastpath.scheduling.candidates import Candidate, CandidateRanking
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.policy import BatchPolicy, ItemBucket, policy_batch_sizes
from fastpath.scheduling.tickets import WorkItem, rank_key

if TYPE_CHECKING:
    from fastpath.scheduling.queue import BatchQueue

_MIN_WAIT_S = 50e-6  # waiting less than this is not worth a wake-up


@dataclasses.dataclass(frozen=True)
class Choice:
    """A candidate a rule picked: run it, anchored on ``anchor``, because of ``rule``."""

    candidate: Candidate
    anchor: WorkItem
    rule: str


class _Risk(NamedTuple):
    """A queued item with a deadline: the latest clock time its batch can start (ties: arrival order)."""

    start_by_s: float
    seq: int
    item: WorkItem


class _Round:
    """One decision's view of the queue: its buckets in order, their positions, and the candidate ranking."""

    def __init__(self, queue: BatchQueue, rules: CostRules) -> None:
        self.buckets = queue.buckets()
        self.position = {bucket.key: index for index, bucket in enumerate(self.buckets)}
        self.ranking = CandidateRanking(self.buckets, batch_sizes=rules.batch_sizes, costs=rules.costs,
                                        min_padding_gain=rules.min_padding_gain)


class CostRules(BatchPolicy):
    """The cost rules (module docstring) over the buckets a subclass defines (``bucket_of``, ``buckets``).

    Args:
        batch_sizes: strictly increasing batch sizes starting at 1 (the engine's); the last is the largest batch.
        costs: the shared cost model.
        max_queue_delay_s: rule (c), seconds.
        deadline_margin_s: rule (b) slack, seconds.
        min_padding_gain: extra padding (a wider range, filler rows) or waiting must promise at least
            this factor more efficiency than the plain choice; predictions are noisy on a shared
            machine, and a coin-flip "gain" would only buy padding.
        pad_to_longest: a batch pads to its longest item instead of up to its bucket's length. For
            engines that run any shape at the same speed per token (ONNX Runtime on the CPU: no
            CUDA graphs or optimization profiles to match); buckets still group items of similar
            length. Off: every batch has its bucket's length (or its longest item, beyond it).

    Raises:
        ConfigError, ValueError: bad ``batch_sizes`` (:func:`~fastpath.scheduling.policy.policy_batch_sizes`).
    """

    merges_buckets = True  # candidates may span neighbouring buckets (False: a batch holds one bucket's items)

    def __init__(self, *, batch_sizes: Sequence[int], costs: CostModel, max_queue_delay_s: float,
                 deadline_margin_s: float = 0.0, min_padding_gain: float = 1.1, pad_to_longest: bool = False) -> None:
        self.batch_sizes = policy_batch_sizes(batch_sizes)
        self.costs, self.pad_to_longest = costs, pad_to_longest
        self.max_queue_delay_s, self.deadline_margin_s = max_queue_delay_s, deadline_margin_s
        self.min_padding_gain = min_padding_gain

    def rows_for(self, count: int) -> int:
        """The smallest batch size holding ``count`` items (the largest beyond it)."""
        return self.batch_sizes.up_or_largest(count)

    def next_batch(self, queue: BatchQueue, now: float, *, flush: bool) -> Batch | float | None:
        """See :meth:`BatchPolicy.next_batch`: a lone item that runs now regardless (flush or drain)
        takes :meth:`_form_lone`'s short cut, anything else :meth:`decide`."""
        if len(queue) == 1 and (flush or queue.closed):
            return self._form_lone(queue, now)
        return self.decide(queue, now, flush=flush)

    def decide(self, queue: BatchQueue, now: float, *, flush: bool) -> Batch | float:
        """The rules in order (module docstring): the batch to run now (taken out of ``queue``), or the
        clock time to ask again."""
        round_ = _Round(queue, self)
        head = queue.head()
        oldest_s = min(item.arrival_s for bucket in round_.buckets for item in bucket.items)
        pick = self._pick(round_, head, oldest_s, now, flush or queue.closed)
        # deadline: an item whose batch must start before the picked batch would end (when this engine
        # asks next) runs now instead; while the engine waits, the driver asks again at its risk time.
        horizon_s = 0.0 if isinstance(pick, float) else \
            self.costs.estimate(pick.candidate.size, round_.buckets[pick.candidate.hi].length)
        anchor = self._most_urgent(round_, now + horizon_s)
        if anchor is not None:
            return self._form(queue, round_, Choice(self._best(round_, anchor), anchor, "deadline"), now)
        if isinstance(pick, float):
            return min(pick, oldest_s + self.max_queue_delay_s, self._next_risk_s(round_))
        return self._form(queue, round_, pick, now)

    def _pick(self, round_: _Round, head: WorkItem, oldest_s: float, now: float, draining: bool) -> Choice | float:
        """The choice of the rules after ``deadline``, or the clock time worth waiting until (rule ``idle``).

        ``full`` yields to ``delay``: once the oldest item has waited ``max_queue_delay_s``, the
        head's batch runs even while another bucket holds a full batch, and ``full`` runs only a
        bucket whose head has the head's priority level. Otherwise a bucket refilled to 64 texts by
        sustained load would run every time, and a lone text of another length (or of a better
        priority level) would wait until the load stopped (41 s under 8 clients).
        """
        overdue = now - oldest_s >= self.max_queue_delay_s
        if not overdue:
            full = self._full_bucket(round_, head.priority_level)
            if full is not None:
                return Choice(round_.ranking.single(full), round_.buckets[full].items[0], "full")
        best = self._best(round_, head)
        if draining:
            return Choice(best, head, "drain")
        if overdue:
            return Choice(best, head, "delay")
        wait_until = self._worth_waiting(round_, best, now, oldest_s)
        return Choice(best, head, "idle") if wait_until is None else wait_until

    def _best(self, round_: _Round, anchor: WorkItem) -> Candidate:
        """The anchor's best candidate: over runs of buckets around its own, or its bucket alone."""
        home = round_.position[self.bucket_of(anchor).key]
        return round_.ranking.best(home) if self.merges_buckets else round_.ranking.single(home)

    def _risk_s(self, item: WorkItem, bucket: ItemBucket) -> float:
        """Latest clock time ``item``'s batch can start and still end ``deadline_margin_s`` before its deadline."""
        size = self.rows_for(min(len(bucket.items), self.batch_sizes.largest))
        return item.deadline_s - self.costs.estimate(size, bucket.length) - self.deadline_margin_s

    def _risks(self, round_: _Round) -> list[_Risk]:
        return [_Risk(self._risk_s(item, bucket), item.seq, item) for bucket in round_.buckets for item in bucket.items
                if item.deadline_s is not None]

    def _most_urgent(self, round_: _Round, by_s: float) -> WorkItem | None:
        """The item that must start by clock time ``by_s`` to meet its deadline (the most urgent), if any."""
        urgent = min(self._risks(round_), key=lambda risk: (risk.start_by_s, risk.seq), default=None)
        return urgent.item if urgent is not None and urgent.start_by_s <= by_s else None

    def _next_risk_s(self, round_: _Round) -> float:
        return min((risk.start_by_s for risk in self._risks(round_)), default=float("inf"))

    def _full_bucket(self, round_: _Round, level: int) -> int | None:
        """The bucket with a full largest batch whose head ranks best, if any; only buckets whose head
        has priority ``level`` (a better-priority item elsewhere must not wait behind them)."""
        largest = self.batch_sizes.largest
        full = [index for index, bucket in enumerate(round_.buckets)
                if len(bucket.items) >= largest and bucket.items[0].priority_level == level]
        return min(full, key=lambda index: rank_key(round_.buckets[index].items[0]), default=None)

    def _worth_waiting(self, round_: _Round, best: Candidate, now: float, oldest_s: float) -> float | None:
        """Clock time worth waiting until for more items, or None to run ``best`` now.

        Waiting ``fill_s`` for the next batch size idles the engine that long; it pays only if the
        fuller batch's efficiency, idle time included, beats running ``best`` now.
        """
        target = self.batch_sizes.above(best.served)
        if target is None or best.in_range >= target:
            return None  # already the largest batch, or the cost model chose to leave items waiting
        rate = sum(round_.buckets[index].rate.per_s(now) for index in range(best.lo, best.hi + 1))
        if rate <= 0:
            return None
        fill_s = max((target - best.in_range) / rate, _MIN_WAIT_S)
        if now + fill_s > oldest_s + self.max_queue_delay_s:
            return None
        useful_s = best.useful_s / best.served * target
        cost_s = fill_s + self.costs.estimate(target, round_.buckets[best.hi].length, floor=True)
        return now + fill_s if useful_s / cost_s > best.efficiency * self.min_padding_gain else None

    def _form_lone(self, queue: BatchQueue, now: float) -> Batch:
        """The batch of the only queued item when it runs now regardless (flush or drain): what the
        rules would form (one row at its bucket's length; no candidate to compare), without ranking
        candidates over every bucket. It is the c=1 inline path's whole plan (~50 us saved per
        request on the dev machine, docs/benchmarks/scheduler_cpu.md)."""
        bucket = next(bucket for bucket in queue.buckets() if bucket.items)
        (item,) = bucket.items
        at_risk = item.deadline_s is not None and self._risk_s(item, bucket) <= now
        queue.take((item,), (bucket,))
        length = item.tokens if self.pad_to_longest else max(bucket.length, item.tokens)
        rule = "deadline" if at_risk else "full" if self.batch_sizes.largest == 1 else "drain"
        return Batch(items=(item,), batch_size=1, length=length, rule=rule, formed_s=now,
                     predicted_s=self.costs.estimate(1, length))

    def _form(self, queue: BatchQueue, round_: _Round, choice: Choice, now: float) -> Batch:
        """Take the chosen candidate's items out of the queue: the anchor first, then by (priority, arrival)."""
        candidate, anchor = choice.candidate, choice.anchor
        buckets = round_.buckets[candidate.lo : candidate.hi + 1]
        ranked = [anchor] + [item for item in heapq.merge(*(b.items for b in buckets), key=rank_key) if item is not anchor]
        chosen = ranked[: candidate.served]
        gave = queue.take(chosen, buckets)
        longest = max(item.tokens for item in chosen)
        length = longest if self.pad_to_longest else max(max(bucket.length for bucket in gave), longest)
        size = max(candidate.size, len(chosen))
        return Batch(items=tuple(chosen), batch_size=size, length=length, rule=choice.rule, formed_s=now,
                     predicted_s=self.costs.estimate(size, length))
