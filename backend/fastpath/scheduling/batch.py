"""What the scheduler's policy core hands its driver: a :class:`Batch` to run, inside a :class:`Decision`.

Formed by a batch policy (:mod:`fastpath.scheduling.policy`) through
:meth:`fastpath.scheduling.queue.BatchQueue.next_batch`, or planned for a whole call
(:meth:`fastpath.scheduling.call_plan.CallPlanPolicy.plan`); staged, run and answered by
:class:`~fastpath.scheduling.runner.BatchRunner` through the model's
:class:`~fastpath.scheduling.hooks.BatchHandler`.
"""

from __future__ import annotations

import dataclasses

from fastpath.scheduling.tickets import WorkItem


@dataclasses.dataclass(frozen=True, eq=False)
class Batch:
    """Texts (or images) that run as one engine call.

    Attributes:
        items: the real texts, in row order; rows ``len(items)..batch_size-1`` are filler.
        batch_size: the batch size the engine runs (>= ``len(items)``).
        length: padded sequence length in tokens (a length bucket, or the longest text beyond the last;
            the longest text with ``pad_to_longest``); an image bucket's 32x32 cells.
        rule: why it runs now: ``deadline`` | ``full`` | ``drain`` | ``delay`` | ``idle`` (the cost
            rules, :mod:`fastpath.scheduling.rules`), ``plan`` (a planned call), or the policy's own.
        formed_s: clock time the batch was formed.
        predicted_s: predicted engine seconds for [batch_size, length].
    """

    items: tuple[WorkItem, ...]
    batch_size: int
    length: int
    rule: str
    formed_s: float
    predicted_s: float

    @property
    def texts(self) -> int:
        """Real texts in the batch (rows before the filler)."""
        return len(self.items)

    @property
    def real_tokens(self) -> int:
        """Tokens of the real texts (no padding)."""
        return sum(item.tokens for item in self.items)

    @property
    def padded_tokens(self) -> int:
        """Tokens the engine processes: ``batch_size * length``."""
        return self.batch_size * self.length


@dataclasses.dataclass(frozen=True)
class Decision:
    """Answer of :meth:`BatchQueue.next_batch`.

    Attributes:
        batch: the batch to run now, or None.
        expired: texts that timed out in the queue; the caller answers their tickets.
        wake_s: when no batch runs: clock time to ask again (None: when a text arrives).
    """

    batch: Batch | None
    expired: tuple[WorkItem, ...] = ()
    wake_s: float | None = None
