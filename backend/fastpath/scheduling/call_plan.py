"""The call planner: everything queued runs now, cut into the engine calls of least predicted time.

In text_embedding's ``response_mode=return`` every text of an ``execute()`` call runs before the
call returns, so there is nothing to wait for and no one to reorder: the only choice is how to cut
the call's texts into engine calls. Texts are grouped by length bucket; neighbouring buckets merge
(the shorter texts padded up to the longer bucket) when the cost model predicts the merged call
costs less than separate ones, which on a GPU, where padding costs little next to a launch and a
host sync, is nearly always; on a CPU it rarely is. A group larger than the largest batch size runs
as several calls, and each call's rows are snapped up to a batch size (a captured CUDA graph) or
split into smaller sizes, whichever the cost model predicts is cheaper.

The search is exact over contiguous runs of the buckets present (a dynamic program over at most
``len(length_buckets)`` groups, ``O(K^2)`` cost look-ups, memoized per plan): merging
non-neighbouring buckets while skipping one between them can never be cheaper, since the skipped
texts fit the merged call's length for free.

:class:`CallPlanPolicy` is a :class:`~fastpath.scheduling.policy.BatchPolicy`: in a queue it runs the
first call of the plan of everything queued, at once. text_embedding's return mode calls
:meth:`CallPlanPolicy.plan` directly on a call's texts, with no queue or tickets in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from fastpath.scheduling.batch import Batch
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.lengths import LengthBuckets
from fastpath.scheduling.policy import BatchPolicy, BucketSpec, policy_batch_sizes
from fastpath.scheduling.tickets import WorkItem

if TYPE_CHECKING:
    from fastpath.scheduling.queue import BatchQueue

PLAN_RULE = "plan"  # Batch.rule of a planned call


class CallPlanPolicy(BatchPolicy):
    """Plans engine calls for texts that all run now.

    Args:
        length_buckets: strictly increasing padded lengths in tokens; the last bounds a text (the
            tokenizer truncates at ``max_seq_length``, text_embedding's last bucket).
        batch_sizes: strictly increasing batch sizes starting at 1 (the captured graph sizes).
        costs: the cost model; calls are compared on its uncontended floor.
        pad_to_longest: the engine runs any shape (ONNX Runtime on the CPU, no captured graphs):
            each call pads to its longest text, not its bucket, and has no filler rows (its
            ``batch_size`` is its text count; calls still hold at most the largest batch size);
            grouping still follows the length buckets.

    Raises:
        ConfigError: a bucket list that is empty or not strictly increasing positive integers.
        ValueError: ``batch_sizes`` does not start at 1 (:func:`~fastpath.scheduling.policy.policy_batch_sizes`).
    """

    def __init__(self, *, length_buckets: Sequence[int], batch_sizes: Sequence[int], costs: CostModel,
                 pad_to_longest: bool = False) -> None:
        self.length_buckets = LengthBuckets(length_buckets)
        self.batch_sizes = policy_batch_sizes(batch_sizes)
        self.costs = costs
        self.pad_to_longest = pad_to_longest

    def buckets(self) -> Sequence[BucketSpec]:
        return self.length_buckets.specs

    def bucket_of(self, item: WorkItem) -> BucketSpec:
        return self.length_buckets.bucket_of(item)

    def rows_for(self, count: int) -> int:
        return count if self.pad_to_longest else self.batch_sizes.up_or_largest(count)

    def next_batch(self, queue: BatchQueue, now: float, *, flush: bool) -> Batch:
        """The first call of the plan of every queued text (nothing waits: each call runs at once)."""
        buckets = queue.buckets()
        first = self.plan([item for bucket in buckets for item in bucket.items], now)[0]
        queue.take(first.items, buckets)
        return first

    def plan(self, items: Sequence[WorkItem], now: float) -> list[Batch]:
        """Cut ``items`` into engine calls of least predicted total time.

        Args:
            items: the texts (``tokens`` >= 1, <= the last length bucket).
            now: clock time, the calls' ``formed_s``.

        Returns:
            The calls (rule ``plan``), shortest group first, each text in exactly one, shortest
            first within a call.

        Raises:
            ValueError: a text outside [1, last bucket] tokens (naming its position in ``items``).
        """
        if len(items) == 1:  # a lone text (every call at c=1): one call of batch 1, nothing to compare
            item = self._checked(0, items[0])
            length = self._run_length([[item]], 1)
            return [Batch(items=(item,), batch_size=1, length=length, rule=PLAN_RULE, formed_s=now,
                          predicted_s=self.costs.estimate(1, length, floor=True))]
        members = self._groups(items)
        lengths = [self._run_length(members, hi) for hi in range(1, len(members) + 1)]
        sizing = _Sizing(self)
        plan = []
        for lo, hi in self._runs(members, lengths, sizing):
            texts = [item for group in members[lo:hi] for item in group]
            start = 0
            for size in sizing.cheapest(len(texts), lengths[hi - 1]).sizes:
                chunk = tuple(texts[start : start + size])
                start += len(chunk)
                if self.pad_to_longest:
                    rows, length = len(chunk), chunk[-1].tokens
                else:
                    rows, length = self.batch_sizes.up_or_largest(len(chunk)), lengths[hi - 1]
                plan.append(Batch(items=chunk, batch_size=rows, length=length, rule=PLAN_RULE, formed_s=now,
                                  predicted_s=self.costs.estimate(rows, length, floor=True)))
        return plan

    def _groups(self, items: Sequence[WorkItem]) -> list[list[WorkItem]]:
        """The items of each length bucket present, buckets in order, each group shortest first."""
        groups: dict[int, list[WorkItem]] = {}
        for index, item in enumerate(items):
            groups.setdefault(self.length_buckets.bucket_of(self._checked(index, item)).key, []).append(item)
        return [sorted(groups[key], key=_tokens) for key in sorted(groups)]

    def _checked(self, index: int, item: WorkItem) -> WorkItem:
        """``item`` (text ``index`` of the plan's items), after checking its tokens fit the length buckets."""
        last = self.length_buckets.lengths.largest
        if not 1 <= item.tokens <= last:
            raise ValueError(f"text {index} has {item.tokens} tokens; expected 1..{last} (the last length bucket)")
        return item

    def _run_length(self, members: list[list[WorkItem]], hi: int) -> int:
        """Padded length of a merged run ending at group ``hi - 1`` (its longest text, or that group's bucket)."""
        if self.pad_to_longest:
            return members[hi - 1][-1].tokens
        return self.length_buckets.bucket_of(members[hi - 1][0]).length

    @staticmethod
    def _runs(members: list[list[WorkItem]], lengths: list[int], sizing: _Sizing) -> list[tuple[int, int]]:
        """The merged runs ``(lo, hi)`` (groups ``lo .. hi - 1``) of least total predicted time, in order."""
        # best[j]: least seconds for the groups members[:j]; cut[j]: where its last merged run starts
        best = [0.0] + [float("inf")] * len(members)
        cut = [0] * (len(members) + 1)
        for hi in range(1, len(members) + 1):
            count = 0
            for lo in range(hi - 1, -1, -1):
                count += len(members[lo])
                seconds = best[lo] + sizing.cheapest(count, lengths[hi - 1]).seconds
                if seconds < best[hi]:
                    best[hi], cut[hi] = seconds, lo
        runs = []
        hi = len(members)
        while hi:
            runs.append((cut[hi], hi))
            hi = cut[hi]
        return runs[::-1]


class _Option(NamedTuple):
    """One way to run some texts at one length: engine calls of ``sizes`` rows, ``seconds`` in all."""

    seconds: float
    sizes: tuple[int, ...]


class _Sizing:
    """The cheapest batch sizes for ``count`` texts at one length, memoized for one plan."""

    def __init__(self, policy: CallPlanPolicy) -> None:
        self.batch_sizes = policy.batch_sizes
        self.pad_to_longest = policy.pad_to_longest
        self.costs = policy.costs
        self._memo: dict[tuple[int, int], _Option] = {}

    def _estimate(self, batch: int, length: int) -> float:
        return self.costs.estimate(batch, length, floor=True)

    def cheapest(self, count: int, length: int) -> _Option:
        """The cheapest way to run ``count`` texts at ``length``."""
        key = (count, length)
        if key not in self._memo:
            largest = self.batch_sizes.largest
            if count > largest:
                rest = self.cheapest(count - largest, length)
                option = _Option(self._estimate(largest, length) + rest.seconds, (largest, *rest.sizes))
            elif self.pad_to_longest:
                option = _Option(self._estimate(count, length), (count,))
            else:
                up = self.batch_sizes.up_or_largest(count)
                option = _Option(self._estimate(up, length), (up,))
                below = self.batch_sizes.down(count)
                if below < count:  # a full smaller size, the rest in further calls
                    rest = self.cheapest(count - below, length)
                    split = _Option(self._estimate(below, length) + rest.seconds, (below, *rest.sizes))
                    option = split if split.seconds < option.seconds else option
            self._memo[key] = option
        return self._memo[key]


def _tokens(item: WorkItem) -> int:
    return item.tokens
