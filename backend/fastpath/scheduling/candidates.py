"""Candidate batches of the cost rules (:mod:`fastpath.scheduling.rules`) and how they are ranked.

A candidate is a run of adjacent buckets ``[lo, hi]`` holding the anchor item, padded to bucket
``hi``'s length and snapped to a batch size down (the best-ranked items run, the rest wait) or up
(filler rows). Its *efficiency* is the ideal engine time of the items it serves (their tokens at the
per-token cost of a full largest batch) over its predicted engine time, both from the cost model's
uncontended floor (:class:`~fastpath.scheduling.costs.CostModel`). Which candidate runs, and when,
is the rules' business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fastpath.graphs.buckets import Sizes
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.policy import ItemBucket


@dataclasses.dataclass(slots=True)  # not frozen: the ranking builds hundreds per decision, and a frozen init costs 2x
class Candidate:
    """One candidate batch: the items of buckets ``[lo, hi]``, ``served`` of them in a batch of ``size`` rows.

    Attributes:
        lo, hi: first and last bucket (indices into the ranking's buckets).
        served: real items that run.
        size: the batch size (rows).
        in_range: items queued in buckets ``[lo, hi]``.
        useful_s: ideal engine seconds of the served items (see :meth:`CandidateRanking.ideal_s_per_token`).
        cost_s: predicted engine seconds of the batch (cost floor).
    """

    lo: int
    hi: int
    served: int
    size: int
    in_range: int
    useful_s: float
    cost_s: float

    @property
    def efficiency(self) -> float:
        return self.useful_s / self.cost_s if self.cost_s > 0 else 0.0


class CandidateRanking:
    """The candidates of one decision over ``buckets`` (in order; a run ``[lo, hi]`` is adjacent buckets).

    Args:
        buckets: the queue's buckets; ``length`` is each one's cost length.
        batch_sizes: the batch sizes a batch snaps to.
        costs: the cost model (its floor compares shapes).
        min_padding_gain: a wider range or filler rows must promise this factor more efficiency.
    """

    def __init__(self, buckets: Sequence[ItemBucket], *, batch_sizes: Sizes, costs: CostModel,
                 min_padding_gain: float) -> None:
        self.buckets = buckets
        self.batch_sizes = batch_sizes
        self.max_batch = batch_sizes.largest
        self.costs = costs
        self.min_padding_gain = min_padding_gain
        self._useful: list[float] | None = None

    def ideal_s_per_token(self, index: int) -> float:
        """Engine seconds per token of an item of bucket ``index`` in a full largest batch: the cost floor."""
        length = self.buckets[index].length
        return self.costs.estimate(self.max_batch, length, floor=True) / (self.max_batch * length)

    def useful_by_bucket(self) -> list[float]:
        """Ideal engine seconds of each bucket's queued items (tokens x ideal seconds per token)."""
        if self._useful is None:
            self._useful = [sum(item.tokens for item in bucket.items) * self.ideal_s_per_token(index) if bucket.items else 0.0
                            for index, bucket in enumerate(self.buckets)]
        return self._useful

    def candidate(self, lo: int, hi: int, in_range: int, useful_s: float) -> Candidate:
        """Best snapping of the items in buckets [lo, hi]: cut down to a batch size, or pad up with filler rows.

        ``useful_s`` is the ideal engine time of all ``in_range`` items; a cut serves its share.
        """
        count = min(in_range, self.max_batch)
        length = self.buckets[hi].length
        down, up = self.batch_sizes.down(count), self.batch_sizes.up_or_largest(count)
        cut = Candidate(lo=lo, hi=hi, served=down, size=down, in_range=in_range, useful_s=useful_s * down / in_range,
                        cost_s=self.costs.estimate(down, length, floor=True))
        if up == down:
            return cut
        padded = Candidate(lo=lo, hi=hi, served=count, size=up, in_range=in_range, useful_s=useful_s * count / in_range,
                           cost_s=self.costs.estimate(up, length, floor=True))
        return padded if padded.efficiency >= cut.efficiency * self.min_padding_gain else cut

    def single(self, index: int) -> Candidate:
        """The best batch of bucket ``index`` alone."""
        return self.candidate(index, index, len(self.buckets[index].items), self.useful_by_bucket()[index])

    def best(self, home: int) -> Candidate:
        """The most efficient candidate (ideal / predicted engine time) among runs of buckets around bucket ``home``.

        Efficiency charges every padded token and filler row: merging short items into a long
        batch, or padding 5 items up to 8 rows, wins only where the per-call overhead it saves is
        larger than the padding it adds, by at least ``min_padding_gain``.
        """
        useful = self.useful_by_bucket()
        counts = [len(bucket.items) for bucket in self.buckets]
        # Cost of running each bucket's items as their own batch: a range of buckets must beat that
        # too, or a short anchor would "gain" by riding along with long items that run efficiently
        # anyway (the anchor's own batch is tiny), padding the short one to the long ones' length.
        alone = [self.costs.estimate(self.batch_sizes.up_or_largest(min(count, self.max_batch)), bucket.length, floor=True)
                 if count else 0.0 for count, bucket in zip(counts, self.buckets)]
        count_prefix, useful_prefix, alone_prefix = [0], [0.0], [0.0]
        for count, value, cost in zip(counts, useful, alone):
            count_prefix.append(count_prefix[-1] + count)
            useful_prefix.append(useful_prefix[-1] + value)
            alone_prefix.append(alone_prefix[-1] + cost)
        own = self.candidate(home, home, counts[home], useful[home])
        best = own
        for lo in (index for index in range(home + 1) if counts[index]):
            for hi in (index for index in range(home, len(counts)) if counts[index]):
                in_range = count_prefix[hi + 1] - count_prefix[lo]
                in_useful = useful_prefix[hi + 1] - useful_prefix[lo]
                candidate = self.candidate(lo, hi, in_range, in_useful)
                separate_s = alone_prefix[hi + 1] - alone_prefix[lo]
                if lo != hi and separate_s > 0 and candidate.efficiency < in_useful / separate_s * self.min_padding_gain:
                    continue
                if (candidate.efficiency, candidate.served) > (best.efficiency, best.served):
                    best = candidate
        return best if best.efficiency >= own.efficiency * self.min_padding_gain else own
