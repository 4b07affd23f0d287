"""What :class:`~fastpath.scheduling.runner.BatchRunner` calls: the model's batch handler and the metrics observer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fastpath.scheduling.batch import Batch


class BatchHandler(Protocol):
    """What the runner needs from a model."""

    def stage(self, batch: Batch) -> Any:
        """Build engine inputs for ``batch`` (``batch.batch_size`` rows of ``batch.length`` tokens)."""

    def run(self, staged: Any) -> Any:
        """Run the engine on staged inputs; raise on failure (only this batch fails)."""

    def finish(self, batch: Batch, outputs: Any) -> None:
        """Hand each real row's result to its ticket (``item.ticket.set_row(item.row, value)``)."""


class SchedulerObserver:
    """Hooks for metrics; the default does nothing. Called from the runner's threads."""

    def dispatched(self, batch: Batch, queue_delays_s: Sequence[float], *, inline: bool = False) -> None:
        """A batch was formed; ``queue_delays_s`` per real text. ``inline``: Triton's ``execute()`` runs it
        (its time is inside Triton's request statistics), not the scheduler after ``execute()`` returned."""

    def batch_done(self, batch: Batch, seconds: float, error: BaseException | None, *, inline: bool = False) -> None:
        """The engine ran ``batch`` in ``seconds`` (failed with ``error`` if set); ``inline`` as in :meth:`dispatched`."""

    def ran_inline(self, batch: Batch, queue_delay_s: float, seconds: float) -> None:
        """``execute()`` ran ``batch`` itself, in ``seconds``, after each of its texts waited ``queue_delay_s``:
        :meth:`dispatched` and :meth:`batch_done` with ``inline=True``, in one call."""
        self.dispatched(batch, (queue_delay_s,) * batch.texts, inline=True)
        self.batch_done(batch, seconds, None, inline=True)

    def rejected(self, reason: str, texts: int) -> None:
        """Texts answered with an error before running: ``queue_full`` | ``shutdown`` | ``timeout`` | ``cancelled``."""

    def invalid_request(self) -> None:
        """A request was answered 400 for bad input before reaching the queue (the adapter calls this)."""
