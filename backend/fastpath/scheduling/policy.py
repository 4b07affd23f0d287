"""The batch-policy interface: what runs next, given the queue and the cost model.

:class:`~fastpath.scheduling.queue.BatchQueue` holds accepted items in buckets and keeps what every
policy shares: the queue bound, all-or-nothing submits, timeouts, close and drain. A
:class:`BatchPolicy` decides the rest: which bucket an item joins, and, whenever an engine is free
(or about to be), which queued items run together now, or until when it is worth waiting.

Implementations, one module each (a model hands an instance to ``BatchQueue(policy, ...)``):

* :class:`~fastpath.scheduling.lengths.LengthBucketPolicy`: texts in length buckets; neighbouring
  buckets merge, batches are cut or padded, and waiting happens, where the cost model predicts a gain
  (the cost rules, :mod:`fastpath.scheduling.rules`);
* :class:`~fastpath.scheduling.shapes.ExactShapePolicy`: the same rules, one bucket per exact shape,
  never merged (text_detection's images);
* :class:`~fastpath.scheduling.call_plan.CallPlanPolicy`: everything queued, now, cut into the
  engine calls of least predicted total time (text_embedding's ``response_mode=return``).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from fastpath.graphs.buckets import Sizes
from fastpath.scheduling.rates import ArrivalRate
from fastpath.scheduling.tickets import WorkItem

if TYPE_CHECKING:
    from fastpath.scheduling.batch import Batch
    from fastpath.scheduling.costs import CostModel
    from fastpath.scheduling.queue import BatchQueue


def policy_batch_sizes(values: Sequence[int]) -> Sizes:
    """``values`` as a policy's batch sizes: strictly increasing positive integers starting at 1, so
    that any single item can run.

    Raises:
        ConfigError: not strictly increasing positive integers.
        ValueError: the smallest is not 1.
    """
    sizes = Sizes(values, name="batch_sizes")
    if sizes[0] != 1:
        raise ValueError(f"batch_sizes must start at 1 so any single item can run, got {list(sizes)}")
    return sizes


class BucketSpec(NamedTuple):
    """The bucket an item joins.

    Attributes:
        key: the bucket's identity (a length-bucket index, an exact shape, ...).
        length: the bucket's cost length: what its batches are priced at in the cost model (tokens,
            or an image's 32x32 cells). Every item of one key must give the same length.
    """

    key: Hashable
    length: int


@dataclasses.dataclass(eq=False)
class ItemBucket:
    """One bucket of the queue. Policies read it; only the queue changes it.

    Attributes:
        key: see :class:`BucketSpec`.
        length: see :class:`BucketSpec`.
        items: the queued items, ordered by (priority level, arrival).
        rate: arrival rate of the bucket's items, learned while work is pending.
    """

    key: Hashable
    length: int
    items: list[WorkItem] = dataclasses.field(default_factory=list)
    rate: ArrivalRate = dataclasses.field(default_factory=ArrivalRate)


class BatchPolicy(abc.ABC):
    """Decides which bucket an item joins and what runs next.

    Attributes:
        costs: the cost model the policy predicts with; the runner feeds it each batch's measured
            engine time (``queue.costs``).
        max_idle_buckets: when a new bucket would make more than this many, the queue forgets its
            empty buckets first (None: buckets are never forgotten).
    """

    costs: CostModel
    max_idle_buckets: int | None = None

    def buckets(self) -> Sequence[BucketSpec]:
        """Buckets the queue holds from the start, in order, and never forgets. Default: none (each
        bucket comes with its first item)."""
        return ()

    @abc.abstractmethod
    def bucket_of(self, item: WorkItem) -> BucketSpec:
        """The bucket ``item`` joins. The queue calls it for every item of a request before it changes.

        Raises:
            ValueError: an item this policy cannot hold (a programming error, not bad input); the
                request is refused whole.
        """

    @abc.abstractmethod
    def next_batch(self, queue: BatchQueue, now: float, *, flush: bool) -> Batch | float | None:
        """What runs now on a free engine; ``queue`` holds at least one item, none of them expired.

        Args:
            queue: read its buckets (:meth:`BatchQueue.buckets`), take a batch's items out with
                :meth:`BatchQueue.take`; ``queue.closed``: the model is shutting down.
            now: clock time, seconds.
            flush: no more items will arrive before this batch runs: do not wait for company.

        Returns:
            The batch to run now (its items already taken out of the queue), the clock time worth
            asking again at (waiting for company pays), or None to ask again when an item arrives.
        """

    def rows_for(self, count: int) -> int:
        """Rows an engine call of ``count`` items runs, filler rows after them (used when cancelled
        items leave a formed batch). Default: ``count``."""
        return count
