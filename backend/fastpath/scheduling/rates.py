"""Arrival-rate estimate per length bucket, for the queue's ``idle`` rule (:mod:`fastpath.scheduling.queue`)."""

from __future__ import annotations

_RATE_ALPHA = 0.2  # EWMA weight of the newest inter-arrival gap
_MIN_GAP_S = 1e-6  # requests arriving together count as 1 us apart


class ArrivalRate:
    """Arrival rate of one length bucket, in texts per second.

    EWMAs of the gap between arrivals (one arrival = one request's texts in this bucket) and of
    the texts per arrival; a quiet spell lowers the rate at once (the current gap counts).
    """

    __slots__ = ("last_s", "gap_s", "texts")

    def __init__(self) -> None:
        self.last_s: float | None = None
        self.gap_s: float | None = None
        self.texts = 1.0

    def arrive(self, now: float, texts: int) -> None:
        if self.last_s is not None:
            gap = max(now - self.last_s, _MIN_GAP_S)
            self.gap_s = gap if self.gap_s is None else self.gap_s + _RATE_ALPHA * (gap - self.gap_s)
            self.texts += _RATE_ALPHA * (texts - self.texts)
        else:
            self.texts = float(texts)
        self.last_s = now

    def per_s(self, now: float) -> float:
        if self.gap_s is None or self.last_s is None:
            return 0.0
        return self.texts / max(self.gap_s, now - self.last_s)
