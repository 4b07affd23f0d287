"""Batches for the texts of one ``execute()`` call, chosen by the cost model (``response_mode=return``).

In return mode every text of a call runs before the call returns, so there is nothing to wait for
and no one to reorder: the only choice is how to cut the call's texts into engine calls. Texts are
grouped by length bucket; neighbouring buckets merge (the shorter texts padded up to the longer
bucket) when the cost model predicts the merged call costs less than separate ones, which on a GPU,
where padding costs little next to a launch and a host sync, is nearly always; on a CPU it rarely
is. A group larger than the largest batch bucket runs as several calls, and each call's rows are
snapped up to a batch bucket (a captured CUDA graph) or split into smaller buckets, whichever the
cost model predicts is cheaper.

The search is exact over contiguous runs of the buckets present (a dynamic program over at most
``len(length_buckets)`` groups, ``O(K^2)`` cost look-ups, memoized per call): merging
non-neighbouring buckets while skipping one between them can never be cheaper, since the skipped
texts fit the merged call's length for free.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedBatch:
    """One engine call of a call's plan.

    Attributes:
        indices: positions of its texts in the call's text list, shortest first.
        batch_size: rows the engine runs: a batch bucket >= ``len(indices)``, filler rows after
            the texts (``len(indices)`` itself with ``pad_to_longest``).
        length: padded length in tokens.
        real_tokens: tokens of its texts, without padding.
        predicted_s: the cost model's uncontended estimate for [batch_size, length], seconds.
    """

    indices: tuple[int, ...]
    batch_size: int
    length: int
    real_tokens: int
    predicted_s: float

    @property
    def texts(self) -> int:
        """Real texts in the call (rows before the filler)."""
        return len(self.indices)

    @property
    def padded_tokens(self) -> int:
        """Tokens the engine processes: ``batch_size * length``."""
        return self.batch_size * self.length


def snap_up(count: int, batch_buckets: Sequence[int]) -> int:
    """Smallest batch bucket >= ``count`` (``count`` <= the largest bucket)."""
    return batch_buckets[bisect.bisect_left(batch_buckets, count)]


def plan_call(lengths: Sequence[int], *, length_buckets: Sequence[int], batch_buckets: Sequence[int],
              estimate: Callable[[int, int], float], pad_to_longest: bool = False) -> list[PlannedBatch]:
    """Cut one call's texts into engine calls of least predicted total time.

    Args:
        lengths: token count of each text (>= 1, <= the last length bucket: the tokenizer
            truncates at ``max_seq_length``, which :func:`~fastpath.models.text_embedding.model.scheduler_length_buckets`
            makes the last bucket).
        length_buckets: strictly increasing padded lengths, in tokens.
        batch_buckets: strictly increasing batch sizes starting at 1 (the captured graph sizes).
        estimate: ``(batch_size, length) -> seconds``, e.g. ``CostModel.estimate(..., floor=True)``.
        pad_to_longest: the engine runs any shape (ONNX Runtime on the CPU, no captured graphs):
            each call pads to its longest text, not its bucket, and has no filler rows (its
            ``batch_size`` is its text count; calls still hold at most the largest batch bucket);
            grouping still follows the length buckets.

    Returns:
        The calls, shortest group first; every index of ``lengths`` appears in exactly one.

    Raises:
        ValueError: a length outside [1, last bucket], or empty buckets.
    """
    if not length_buckets or not batch_buckets or batch_buckets[0] != 1:
        raise ValueError(f"length_buckets {tuple(length_buckets)} and batch_buckets {tuple(batch_buckets)}: "
                         "expected non-empty, and batch buckets starting at 1")
    groups: dict[int, list[int]] = {}
    for index, tokens in enumerate(lengths):
        if not 1 <= tokens <= length_buckets[-1]:
            raise ValueError(f"text {index} has {tokens} tokens; expected 1..{length_buckets[-1]} (the last length bucket)")
        groups.setdefault(bisect.bisect_left(length_buckets, tokens), []).append(index)
    present = sorted(groups)
    members = [sorted(groups[g], key=lengths.__getitem__) for g in present]
    largest = batch_buckets[-1]
    memo: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}

    def sizes(count: int, length: int) -> tuple[float, tuple[int, ...]]:
        """(seconds, batch sizes) of the cheapest way to run ``count`` texts at ``length``."""
        key = (count, length)
        if key not in memo:
            if count > largest:
                rest_s, rest = sizes(count - largest, length)
                memo[key] = (estimate(largest, length) + rest_s, (largest, *rest))
            elif pad_to_longest:
                memo[key] = (estimate(count, length), (count,))
            else:
                best = (estimate(snap_up(count, batch_buckets), length), (snap_up(count, batch_buckets),))
                below = batch_buckets[bisect.bisect_right(batch_buckets, count) - 1]
                if below < count:  # a full smaller bucket, the rest in further calls
                    rest_s, rest = sizes(count - below, length)
                    best = min(best, (estimate(below, length) + rest_s, (below, *rest)), key=lambda option: option[0])
                memo[key] = best
        return memo[key]

    def run_length(hi: int) -> int:
        """Padded length of a merged run ending at group ``hi - 1`` (its longest text, or that group's bucket)."""
        if pad_to_longest:
            return lengths[members[hi - 1][-1]]
        return length_buckets[present[hi - 1]]

    # best[j]: least seconds for the groups present[:j]; cut[j]: where its last merged run starts
    best = [0.0] + [float("inf")] * len(present)
    cut = [0] * (len(present) + 1)
    for hi in range(1, len(present) + 1):
        count = 0
        for lo in range(hi - 1, -1, -1):
            count += len(members[lo])
            seconds = best[lo] + sizes(count, run_length(hi))[0]
            if seconds < best[hi]:
                best[hi], cut[hi] = seconds, lo
    runs = []
    hi = len(present)
    while hi:
        runs.append((cut[hi], hi))
        hi = cut[hi]
    plan = []
    for lo, hi in reversed(runs):
        texts = [index for group in members[lo:hi] for index in group]
        length = run_length(hi)
        start = 0
        for size in sizes(len(texts), length)[1]:
            chunk = tuple(texts[start : start + size])
            start += len(chunk)
            rows, chunk_length = (len(chunk), lengths[chunk[-1]]) if pad_to_longest else (snap_up(len(chunk), batch_buckets), length)
            plan.append(PlannedBatch(chunk, rows, chunk_length, sum(lengths[i] for i in chunk), estimate(rows, chunk_length)))
    return plan
