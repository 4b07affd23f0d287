"""Online cost model: predicted engine time of a batch shape (batch bucket x length bucket).

Each (batch size, padded length) cell keeps two statistics of its measured execution times: ``expected``,
an EWMA (what a batch costs now, other load included; used for deadlines and when to stage the next batch),
and ``floor``, a minimum that rises by ``FLOOR_RISE`` of the gap per measurement above it (what the shape costs
uncontended; used to compare shapes, so other work's delays on a shared machine never pass for per-call
overhead). For each statistic a least-squares line ``overhead_s + per_token_s * batch * length`` runs through
the cells (weights capped at ``FIT_WEIGHT_CAP``; a prior until two token counts are measured), and a cell's
prediction is its value shrunk toward the line: ``fit + n / (n + SHRINK_MEASUREMENTS) * (cell - fit)``.
Why each choice: docs/design/scheduler.md#cost-model-costmodel.
"""

from __future__ import annotations

import threading

# Priors used only until two distinct shapes have been measured (warm-up measures several at load):
# a few milliseconds per call plus ~0.1 ms per padded token, the order of ONNX Runtime fp32
# all-MiniLM-L6-v2 on the dev machine's CPU (docs/benchmarks/engines_cpu.md).
PRIOR_OVERHEAD_S = 2e-3
PRIOR_PER_TOKEN_S = 1e-4
FIT_WEIGHT_CAP = 8  # a cell's weight in the linear fit: its measurement count, at most this
SHRINK_MEASUREMENTS = 4.0  # a cell's own value gets half the weight after this many measurements
FLOOR_RISE = 0.02  # the floor moves up by this fraction of the gap per measurement above it

RESUM_EVERY = 4096  # observations between exact recomputations of the fit's running sums

Cell = tuple[int, int]


def _add(sums: list[float], weight: float, tokens: float, seconds: float, sign: float) -> None:
    """Add (sign = 1) or remove (sign = -1) one weighted point (tokens, seconds) from [w, x, y, xx, xy]."""
    weight *= sign
    sums[0] += weight
    sums[1] += weight * tokens
    sums[2] += weight * seconds
    sums[3] += weight * tokens * tokens
    sums[4] += weight * tokens * seconds


class CostModel:
    """Predicted execution seconds per batch shape, learned online. Thread-safe.

    Args:
        alpha: EWMA weight of the newest measurement of a cell, in (0, 1].
        prior_overhead_s: per-call seconds assumed before any fit exists.
        prior_per_token_s: per-padded-token seconds assumed before any fit exists.
    """

    def __init__(self, alpha: float = 0.2, *, prior_overhead_s: float = PRIOR_OVERHEAD_S, prior_per_token_s: float = PRIOR_PER_TOKEN_S) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"cost EWMA alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self._prior = (prior_overhead_s, prior_per_token_s)
        self._expected: dict[Cell, float] = {}
        self._floor: dict[Cell, float] = {}
        self._counts: dict[Cell, int] = {}
        self._fits: dict[bool, tuple[float, float]] = {}  # cached per statistic; cleared on observe
        # Running weighted sums [w, x, y, xx, xy] of each statistic's fit, updated per observation in
        # O(1) instead of a pass over every cell per batch; rebuilt exactly every RESUM_EVERY updates.
        self._sums: dict[bool, list[float]] = {False: [0.0] * 5, True: [0.0] * 5}
        self._updates = 0
        self._lock = threading.Lock()

    def observe(self, batch: int, length: int, seconds: float) -> None:
        """Record one measured execution of a [batch, length] batch, in seconds."""
        if seconds < 0 or batch < 1 or length < 1:
            return
        cell = (batch, length)
        with self._lock:
            count = self._counts.get(cell, 0)
            old = self._expected.get(cell)
            low = self._floor.get(cell)
            self._expected[cell] = seconds if old is None else old + self.alpha * (seconds - old)
            self._floor[cell] = seconds if low is None or seconds < low else low + FLOOR_RISE * (seconds - low)
            self._counts[cell] = count + 1
            self._updates += 1
            if self._updates % RESUM_EVERY == 0:  # bound floating-point drift of the running sums
                self._sums = {floor: self._full_sums(self._floor if floor else self._expected) for floor in (False, True)}
            else:
                tokens = float(batch * length)
                for floor, before, after in ((False, old, self._expected[cell]), (True, low, self._floor[cell])):
                    sums = self._sums[floor]
                    if before is not None:
                        _add(sums, float(min(count, FIT_WEIGHT_CAP)), tokens, before, -1.0)
                    _add(sums, float(min(count + 1, FIT_WEIGHT_CAP)), tokens, after, 1.0)
            self._fits.clear()

    def linear(self, *, floor: bool = False) -> tuple[float, float]:
        """(overhead_s, per_token_s) of the current fit of one statistic, or the prior."""
        with self._lock:
            return self._fit_locked(floor)

    def _fit_locked(self, floor: bool) -> tuple[float, float]:
        fit = self._fits.get(floor)
        if fit is None:
            fit = self._fits[floor] = self._solve(self._sums[floor])
        return fit

    def _full_sums(self, cells: dict[Cell, float]) -> list[float]:
        """[w, x, y, xx, xy] of one statistic over every cell (weights: measurement counts, capped)."""
        sums = [0.0] * 5
        for (batch, length), seconds in cells.items():
            _add(sums, float(min(self._counts[(batch, length)], FIT_WEIGHT_CAP)), float(batch * length), seconds, 1.0)
        return sums

    def _solve(self, sums: list[float]) -> tuple[float, float]:
        """Weighted least squares of cell values on tokens = batch * length, from the running sums."""
        w, x, y, xx, xy = sums
        variance = xx * w - x * x
        if w <= 0 or variance <= 1e-9 * max(1.0, xx * w):
            return self._prior
        slope = (xy * w - x * y) / variance
        intercept = (y - slope * x) / w
        if slope <= 0:  # noise can tilt the fit; never predict that more tokens are free
            return self._prior
        return max(0.0, intercept), slope

    def estimate(self, batch: int, length: int, *, floor: bool = False) -> float:
        """Predicted seconds for a [batch, length] batch: the fit, moved toward the cell's own value.

        Args:
            batch: rows, filler rows included.
            length: padded tokens per row.
            floor: False for the expected time under current load (time predictions); True for
                the uncontended cost (comparing shapes).
        """
        cell = (batch, length)
        with self._lock:
            overhead, per_token = self._fit_locked(floor)
            fit = overhead + per_token * batch * length
            value = (self._floor if floor else self._expected).get(cell)
            if value is None:
                return fit
            count = self._counts[cell]
        return fit + count / (count + SHRINK_MEASUREMENTS) * (value - fit)

    def measured(self, *, floor: bool = False) -> dict[Cell, float]:
        """A copy of one statistic per measured cell, {(batch, length): seconds}."""
        with self._lock:
            return dict(self._floor if floor else self._expected)
