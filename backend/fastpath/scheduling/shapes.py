"""Exact-shape buckets: a :class:`~fastpath.scheduling.queue.BatchQueue` whose buckets are shapes.

For inputs that cannot be padded to a common size without changing results (an image detector's
DB post-processing depends on the exact resized size), a batch may only hold items of one shape.
:class:`ShapeBatchQueue` keeps every :class:`BatchQueue` rule (expire, deadline, full, drain,
delay, idle; cut down to a batch bucket or pad up with filler rows, decided by the cost model) but

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

from fastpath.scheduling.candidates import Candidate
from fastpath.scheduling.costs import CostModel
from fastpath.scheduling.queue import BatchQueue
from fastpath.scheduling.rates import ArrivalRate
from fastpath.scheduling.tickets import WorkItem

Shape = tuple[int, ...]


class ShapeBatchQueue(BatchQueue):
    """A :class:`BatchQueue` with one bucket per distinct exact shape; batches never mix shapes.

    Args:
        batch_buckets: strictly increasing batch sizes starting at 1 (e.g. 1, 2, 4, 8).
        costs: the shared cost model; cells are (batch size, ``tokens`` of the shape).
        max_queue_delay_s: rule (c), seconds.
        max_items: queue bound in items (UnavailableError beyond it).
        deadline_margin_s: rule (b) slack, seconds.
        min_padding_gain: filler rows or waiting must promise this factor more efficiency.
        max_idle_shapes: when a new shape arrives and this many buckets exist, empty buckets
            (and their arrival rates) are dropped, so the per-decision scan stays short.

    Raises:
        ValueError: bad batch buckets (see :class:`BatchQueue`), or ``max_idle_shapes`` < 1.
    """

    unit = "images"  # text_detection's items (messages only)

    def __init__(self, *, batch_buckets: Sequence[int], costs: CostModel, max_queue_delay_s: float, max_items: int,
                 deadline_margin_s: float = 0.0, min_padding_gain: float = 1.1, max_idle_shapes: int = 64) -> None:
        super().__init__(batch_buckets=batch_buckets, length_buckets=(1,), costs=costs, max_queue_delay_s=max_queue_delay_s,
                         max_texts=max_items, deadline_margin_s=deadline_margin_s, min_padding_gain=min_padding_gain)
        if max_idle_shapes < 1:
            raise ValueError(f"max_idle_shapes must be >= 1, got {max_idle_shapes}")
        self.max_idle_shapes = max_idle_shapes
        self.length_buckets: list[int] = []  # type: ignore[assignment]  # cost length per bucket, grows
        self._groups, self._rates = [], []
        self._shapes: list[Shape] = []
        self._index: dict[Shape, int] = {}

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """The shapes that have a bucket now, in bucket order."""
        return tuple(self._shapes)

    def queued(self, shape: Shape) -> int:
        """Items of ``shape`` waiting now."""
        index = self._index.get(tuple(shape))
        return 0 if index is None else len(self._groups[index])

    def group_of(self, tokens: int) -> int:
        raise TypeError("ShapeBatchQueue buckets are keyed by WorkItem.shape, not by token count; use bucket_of(item)")

    def bucket_of(self, item: WorkItem) -> int:
        """Index of the bucket of ``item.shape`` (the shape must have been submitted)."""
        return self._index[item.shape]

    def submit(self, items: Sequence[WorkItem], now: float, *, engine_busy: bool = False) -> None:
        """Accept all ``items`` or none (see :meth:`BatchQueue.submit`); each needs a ``shape``.

        Every check runs before the first change. Idle buckets are forgotten only when a new shape
        arrives with ``max_idle_shapes`` buckets in place, and never the bucket of a shape this
        request uses (its items are about to join it).

        Raises:
            ValueError: an item has no shape, ``tokens`` < 1, or other ``tokens`` than earlier items
                of its shape (a programming error, not bad input).
            UnavailableError: closed, or over ``max_items`` (retryable).
        """
        new: dict[Shape, int] = {}
        for item in items:
            if item.shape is None or item.tokens < 1:
                raise ValueError(f"ShapeBatchQueue items need a shape and tokens >= 1, got shape={item.shape} tokens={item.tokens}")
            shape = tuple(item.shape)
            index = self._index.get(shape)
            known = self.length_buckets[index] if index is not None else new.setdefault(shape, item.tokens)
            if known != item.tokens:
                raise ValueError(f"shape {shape} has cost length {known}, got an item with tokens={item.tokens}; "
                                 "every item of one shape must have the same tokens")
        self.check_room(len(items))
        for item in items:
            item.shape = tuple(item.shape)
        if new and len(self._shapes) + len(new) > self.max_idle_shapes:
            self._forget_idle_shapes(keep={item.shape for item in items})
        for shape, tokens in new.items():
            self._index[shape] = len(self._shapes)
            self._shapes.append(shape)
            self._groups.append([])
            self._rates.append(ArrivalRate())
            self.length_buckets.append(tokens)
        super().submit(items, now, engine_busy=engine_busy)

    def _forget_idle_shapes(self, keep: set[Shape]) -> None:
        """Drop every empty bucket (and its arrival rate) except those of the shapes in ``keep``;
        bucket indices are renumbered. Nothing queued is touched: only empty buckets go."""
        kept = [index for index, (group, shape) in enumerate(zip(self._groups, self._shapes)) if group or shape in keep]
        self._groups = [self._groups[i] for i in kept]
        self._rates = [self._rates[i] for i in kept]
        self.length_buckets = [self.length_buckets[i] for i in kept]
        self._shapes = [self._shapes[i] for i in kept]
        self._index = {shape: i for i, shape in enumerate(self._shapes)}

    def _best(self, anchor: WorkItem) -> Candidate:
        """The anchor's own shape only: cut down to a batch bucket or pad up with filler rows."""
        return self._single(self.bucket_of(anchor))
