"""The length-bucket policy: texts in length buckets, batches formed by the cost rules.

A text of ``t`` tokens joins the first length bucket ``>= t`` (the last one when none holds it)
and pads to that bucket's length; neighbouring buckets merge into one batch where the cost model
predicts a gain (:mod:`fastpath.scheduling.rules`). text_embedding's sender mode runs on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastpath.graphs.buckets import Sizes
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.policy import BucketSpec
from fastpath.scheduling.rules import CostRules
from fastpath.scheduling.tickets import WorkItem


class LengthBuckets:
    """Length buckets as queue buckets: bucket ``i`` (key ``i``) holds texts of up to ``lengths[i]`` tokens.

    Args:
        lengths: strictly increasing padded lengths in tokens.

    Raises:
        ConfigError: ``lengths`` empty, not strictly increasing, or below 1.
    """

    def __init__(self, lengths: Sequence[int]) -> None:
        self.lengths = Sizes(lengths, name="length_buckets")
        self.specs = tuple(BucketSpec(index, length) for index, length in enumerate(self.lengths))

    def bucket_of(self, item: WorkItem) -> BucketSpec:
        """The first bucket holding ``item.tokens`` tokens; the last one when none does."""
        return self.specs[min(self.lengths.position(item.tokens), len(self.specs) - 1)]


class LengthBucketPolicy(CostRules):
    """:class:`~fastpath.scheduling.rules.CostRules` over length buckets; neighbouring buckets may merge.

    Args:
        length_buckets: strictly increasing padded lengths in tokens (see :class:`LengthBuckets`).
        **rules: :class:`~fastpath.scheduling.rules.CostRules`' arguments (``batch_sizes``, ``costs``,
            ``max_queue_delay_s``, ...).

    Raises:
        ConfigError, ValueError: bad bucket lists (see :class:`LengthBuckets`, :class:`CostRules`).
    """

    def __init__(self, *, length_buckets: Sequence[int], batch_sizes: Sequence[int], costs: CostModel,
                 max_queue_delay_s: float, deadline_margin_s: float = 0.0, min_padding_gain: float = 1.1,
                 pad_to_longest: bool = False) -> None:
        super().__init__(batch_sizes=batch_sizes, costs=costs, max_queue_delay_s=max_queue_delay_s,
                         deadline_margin_s=deadline_margin_s, min_padding_gain=min_padding_gain, pad_to_longest=pad_to_longest)
        self.length_buckets = LengthBuckets(length_buckets)

    def buckets(self) -> Sequence[BucketSpec]:
        """Every length bucket, shortest first, from the start."""
        return self.length_buckets.specs

    def bucket_of(self, item: WorkItem) -> BucketSpec:
        """See :meth:`LengthBuckets.bucket_of`."""
        return self.length_buckets.bucket_of(item)
