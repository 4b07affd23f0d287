"""The exact-shape policy: batches of one exact shape, for inputs that cannot be padded to a common size.

An image detector's DB post-processing depends on the exact resized size, so a batch may only hold
items of one shape. :class:`ExactShapePolicy` keeps every cost rule of
:mod:`fastpath.scheduling.rules` (deadline, full, drain, delay, idle; cut down to a batch size or
pad up with filler rows, decided by the cost model) but

* an item's bucket is its ``WorkItem.shape`` (e.g. an image's resized (height, width)); buckets are
  created as shapes arrive, and idle ones are forgotten once more than ``max_idle_shapes`` exist
  (never one that the arriving request uses);
* buckets are never merged: a batch holds one shape, so no padding across shapes;
* the bucket's cost length is the item's ``tokens`` (its size in the cost model's units, e.g. the
  number of 32x32 pixel cells), the same for every item of one shape.

Filler rows (``Batch.batch_size > len(items)``) are the handler's business: it must fill them with
something that leaves the real rows' results unchanged (text_detection: copies of a real image).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.policy import BucketSpec
from fastpath.scheduling.rules import CostRules
from fastpath.scheduling.tickets import WorkItem


class ExactShapePolicy(CostRules):
    """:class:`~fastpath.scheduling.rules.CostRules` with one bucket per distinct exact shape; batches never mix shapes.

    Args:
        batch_sizes: strictly increasing batch sizes starting at 1 (e.g. 1, 2, 4, 8).
        costs: the shared cost model; cells are (batch size, ``tokens`` of the shape).
        max_queue_delay_s: rule (c), seconds.
        deadline_margin_s: rule (b) slack, seconds.
        min_padding_gain: filler rows or waiting must promise this factor more efficiency.
        max_idle_shapes: when a new shape arrives and this many buckets exist, empty buckets
            (and their arrival rates) are dropped, so the per-decision scan stays short.

    Raises:
        ValueError: bad batch sizes (see :class:`CostRules`), or ``max_idle_shapes`` < 1.
    """

    merges_buckets = False

    def __init__(self, *, batch_sizes: Sequence[int], costs: CostModel, max_queue_delay_s: float,
                 deadline_margin_s: float = 0.0, min_padding_gain: float = 1.1, max_idle_shapes: int = 64) -> None:
        super().__init__(batch_sizes=batch_sizes, costs=costs, max_queue_delay_s=max_queue_delay_s,
                         deadline_margin_s=deadline_margin_s, min_padding_gain=min_padding_gain)
        if max_idle_shapes < 1:
            raise ValueError(f"max_idle_shapes must be >= 1, got {max_idle_shapes}")
        self.max_idle_buckets = max_idle_shapes

    def bucket_of(self, item: WorkItem) -> BucketSpec:
        """The bucket of ``item.shape`` (made a tuple), priced at ``item.tokens``.

        Raises:
            ValueError: the item has no shape or ``tokens`` < 1 (a programming error, not bad input).
        """
        if item.shape is None or item.tokens < 1:
            raise ValueError(f"ExactShapePolicy items need a shape and tokens >= 1, got shape={item.shape} tokens={item.tokens}")
        item.shape = tuple(item.shape)
        return BucketSpec(item.shape, item.tokens)
