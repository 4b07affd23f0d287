"""Work items and the tickets that answer each accepted request exactly once.

A request of n texts becomes one :class:`Ticket` and n :class:`WorkItem` s (one per text), so each
text can join the batch of its own length bucket. The ticket collects the n row results and calls
its ``on_done`` exactly once: with all rows, or with the first error (engine failure of any of its
batches, timeout, cancellation, shutdown). Later results or errors for a finished ticket are
ignored, which is what makes "exactly one response per accepted request" hold under races.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger(__name__)

_UNSET = object()
DoneCallback = Callable[["Ticket", "list[Any] | None", "BaseException | None"], None]


def ask_cancelled(is_cancelled: Callable[[], bool], label: str | None = None) -> bool:
    """Whether ``is_cancelled`` (a request's ``is_cancelled``: a stub-to-server round trip) says the client cancelled;
    False when the question fails (a dead request handle must not take the scheduler down; it is logged)."""
    try:
        return bool(is_cancelled())
    except Exception:
        LOG.exception("is_cancelled() failed for %s", label or "a request")
        return False


class Ticket:
    """One accepted request: ``rows`` results, answered once through ``on_done``.

    Args:
        rows: number of texts (>= 1).
        on_done: ``on_done(ticket, results, error)``; exactly one of ``results`` (a list of
            ``rows`` row values, in row order) and ``error`` is set. Called once, from whichever
            thread completes the ticket; an exception it raises is logged, never propagated.
        is_cancelled: returns True when the client gave up (Triton ``request.is_cancelled()``).
        label: text for logs and error messages (e.g. the request id).

    Raises:
        ValueError: ``rows`` < 1.
    """

    __slots__ = ("rows", "label", "started", "_on_done", "_is_cancelled", "_results", "_missing", "_done", "_lock")

    def __init__(self, rows: int, on_done: DoneCallback, *, is_cancelled: Callable[[], bool] | None = None, label: str = "") -> None:
        if rows < 1:
            raise ValueError(f"a ticket needs at least one row, got rows={rows}")
        self.rows = rows
        self.label = label
        self.started = False  # some row was dispatched: its other rows no longer time out in the queue
        self._on_done = on_done
        self._is_cancelled = is_cancelled
        self._results: list[Any] = [_UNSET] * rows
        self._missing = rows
        self._done = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        """True once ``on_done`` has been (or is being) called."""
        return self._done

    def is_cancelled(self) -> bool:
        """Ask the request's owner whether the client cancelled; False if it cannot say."""
        if self._is_cancelled is None or self._done:
            return False
        return ask_cancelled(self._is_cancelled, self.label)

    def set_row(self, row: int, value: Any) -> None:
        """Store row ``row``'s result; the last missing row completes the ticket."""
        with self._lock:
            if self._done or self._results[row] is not _UNSET:
                return
            self._results[row] = value
            self._missing -= 1
            if self._missing:
                return
            self._done = True
            results = self._results
        self._call(results, None)

    def fail(self, error: BaseException) -> bool:
        """Complete the ticket with ``error`` unless it is already done; True if this call completed it."""
        with self._lock:
            if self._done:
                return False
            self._done = True
        self._call(None, error)
        return True

    def _call(self, results: list[Any] | None, error: BaseException | None) -> None:
        try:
            self._on_done(self, results, error)
        except Exception:
            LOG.exception("answering %s failed", self.label or "a request")


@dataclasses.dataclass(eq=False)
class WorkItem:
    """One text (or image) waiting in the scheduler.

    Attributes:
        ticket: the request this text belongs to; None for the texts of a call planned outside the
            queue (:meth:`~fastpath.scheduling.call_plan.CallPlanPolicy.plan`, whose caller answers them).
        row: the text's row within its request.
        tokens: token count the engine will see ([CLS] and [SEP] included), >= 1.
        payload: what the batch handler needs to stage the text (e.g. a ``tokenizers.Encoding``).
        priority_level: Triton priority level, 1 = highest; larger numbers run later.
        arrival_s: clock time the request was accepted.
        deadline_s: clock time the request times out in the queue (arrival + Triton timeout),
            or None for no timeout.
        shape: exact bucket key for :class:`~fastpath.scheduling.shapes.ExactShapePolicy` (e.g. an
            image's resized (height, width) in pixels); None for length-bucketed texts.
    """

    ticket: Ticket | None
    row: int
    tokens: int
    payload: Any = None
    priority_level: int = 0
    arrival_s: float = 0.0
    deadline_s: float | None = None
    seq: int = -1  # queue order, assigned on submit
    shape: tuple[int, ...] | None = None


def rank_key(item: WorkItem) -> tuple[int, int]:
    """Queue order: priority level (1 = highest), then arrival (``seq``)."""
    return (item.priority_level, item.seq)
