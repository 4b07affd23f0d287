"""Candidate batches of :class:`~fastpath.scheduling.queue.BatchQueue` and how they are ranked.

A candidate is a run of adjacent length buckets ``[lo, hi]`` holding the anchor text, padded to
bucket ``hi`` and snapped to a batch bucket down (the best-ranked texts run, the rest wait) or up
(filler rows). Its *efficiency* is the ideal engine time of the texts it serves (their tokens at the
per-token cost of a full largest batch) over its predicted engine time, both from the cost model's
uncontended floor (:class:`~fastpath.scheduling.costs.CostModel`). The rules that pick one of
them, and when, are :class:`~fastpath.scheduling.queue.BatchQueue`'s (see its module docstring).
"""

from __future__ import annotations

import bisect
import dataclasses

from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.tickets import WorkItem


def rank_key(item: WorkItem) -> tuple[int, int]:
    """Queue order: priority level (1 = highest), then arrival (``seq``)."""
    return (item.priority_level, item.seq)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One candidate batch: the texts of length buckets ``[lo, hi]``, ``served`` of them in a batch of ``size`` rows."""

    lo: int
    hi: int
    served: int  # real texts that run
    size: int  # batch bucket
    in_range: int  # texts queued in [lo, hi]
    useful_s: float  # ideal engine seconds of the served texts (see CandidateRanking._ideal_s_per_token)
    cost_s: float  # predicted engine seconds of the batch

    @property
    def efficiency(self) -> float:
        return self.useful_s / self.cost_s if self.cost_s > 0 else 0.0


class CandidateRanking:
    """The candidate half of :class:`~fastpath.scheduling.queue.BatchQueue` (a base class: it reads
    the queue's ``_groups``, ``batch_buckets``, ``length_buckets``, ``max_batch``, ``costs`` and
    ``min_padding_gain``, and its ``bucket_of``)."""

    _groups: list[list[WorkItem]]
    batch_buckets: tuple[int, ...]
    length_buckets: tuple[int, ...] | list[int]
    max_batch: int
    costs: CostModel
    min_padding_gain: float

    def snap_down(self, count: int) -> int:
        """Largest batch bucket <= ``count``."""
        return self.batch_buckets[bisect.bisect_right(self.batch_buckets, count) - 1]

    def snap_up(self, count: int) -> int:
        """Smallest batch bucket >= ``count`` (the largest bucket if none)."""
        return self.batch_buckets[min(bisect.bisect_left(self.batch_buckets, count), len(self.batch_buckets) - 1)]

    def _ideal_s_per_token(self, group: int) -> float:
        """Engine seconds per token of a text of this bucket in a full largest batch: the cost floor."""
        length = self.length_buckets[group]
        return self.costs.estimate(self.max_batch, length, floor=True) / (self.max_batch * length)

    def _candidate(self, lo: int, hi: int, in_range: int, useful_s: float) -> Candidate:
        """Best snapping of the texts in buckets [lo, hi]: cut down to a bucket, or pad up with filler rows.

        ``useful_s`` is the ideal engine time of all ``in_range`` texts; a cut serves its share.
        """
        count = min(in_range, self.max_batch)
        length = self.length_buckets[hi]
        down, up = self.snap_down(count), self.snap_up(count)
        cut = Candidate(lo, hi, down, down, in_range, useful_s * down / in_range, self.costs.estimate(down, length, floor=True))
        if up == down:
            return cut
        padded = Candidate(lo, hi, count, up, in_range, useful_s * count / in_range, self.costs.estimate(up, length, floor=True))
        return padded if padded.efficiency >= cut.efficiency * self.min_padding_gain else cut

    def _useful_by_group(self) -> list[float]:
        """Ideal engine seconds of each bucket's queued texts (tokens x ideal seconds per token)."""
        return [sum(item.tokens for item in group) * self._ideal_s_per_token(g) if group else 0.0
                for g, group in enumerate(self._groups)]

    def _single(self, group: int) -> Candidate:
        return self._candidate(group, group, len(self._groups[group]), self._useful_by_group()[group])

    def _best(self, anchor: WorkItem) -> Candidate:
        """The most efficient candidate (ideal / predicted engine time) among runs of buckets around the anchor's.

        Efficiency charges every padded token and filler row: merging short texts into a long
        batch, or padding 5 texts up to 8 rows, wins only where the per-call overhead it saves is
        larger than the padding it adds, by at least ``min_padding_gain``.
        """
        home = self.bucket_of(anchor)
        useful = self._useful_by_group()
        counts = [len(group) for group in self._groups]
        # Cost of running each bucket's texts as their own batch: a range of buckets must beat that
        # too, or a short anchor would "gain" by riding along with long texts that run efficiently
        # anyway (the anchor's own batch is tiny), padding the short one to the long ones' length.
        alone = [self.costs.estimate(self.snap_up(min(count, self.max_batch)), self.length_buckets[g], floor=True)
                 if count else 0.0 for g, count in enumerate(counts)]
        count_prefix, useful_prefix, alone_prefix = [0], [0.0], [0.0]
        for count, value, cost in zip(counts, useful, alone):
            count_prefix.append(count_prefix[-1] + count)
            useful_prefix.append(useful_prefix[-1] + value)
            alone_prefix.append(alone_prefix[-1] + cost)
        own = self._candidate(home, home, counts[home], useful[home])
        best = own
        for lo in (index for index in range(home + 1) if counts[index]):
            for hi in (index for index in range(home, len(counts)) if counts[index]):
                in_range = count_prefix[hi + 1] - count_prefix[lo]
                in_useful = useful_prefix[hi + 1] - useful_prefix[lo]
                candidate = self._candidate(lo, hi, in_range, in_useful)
                separate_s = alone_prefix[hi + 1] - alone_prefix[lo]
                if lo != hi and separate_s > 0 and candidate.efficiency < in_useful / separate_s * self.min_padding_gain:
                    continue
                if (candidate.efficiency, candidate.served) > (best.efficiency, best.served):
                    best = candidate
        return best if best.efficiency >= own.efficiency * self.min_padding_gain else own
