"""Online cost model: predicted engine time of a batch shape (batch bucket x length bucket).

Each (batch size, padded length) cell keeps two statistics of its measured execution times:

* ``expected``: an exponentially weighted moving average (EWMA), what a batch costs now, other
  load included. Used for *time* predictions: deadlines (rule b) and when to stage the next batch.
* ``floor``: a slowly rising minimum, what the shape costs when the machine is not contended.
  Used to *compare shapes* (pad or not, merge buckets or not, wait or not). On a shared machine
  other work adds delays per call that look like per-call overhead and change from second to
  second; decisions made on those would trade real padding for imagined savings. The floor
  rises by ``FLOOR_RISE`` per measurement above it, so a lasting change (a slower engine) is
  learned within tens of batches.

For each statistic a linear fit ``overhead_s + per_token_s * batch * length`` runs through the
cells (least squares, one point per cell, weighted by its measurement count up to
``FIT_WEIGHT_CAP``, so the often-run small shapes cannot drown the leverage of the rare large
ones); before two distinct token counts are measured, a prior stands in. The linear form is what
a BERT encoder costs to first order: a fixed per-call overhead plus work proportional to the
padded tokens (attention's length^2 term is small at these lengths). A cell's prediction shrinks
its own value toward the fit by its measurement count ``n``: ``fit + n / (n + SHRINK_MEASUREMENTS)
* (cell - fit)`` (empirical-Bayes style), so a cell seen once or twice cannot look cheaper than its
neighbours by chance, while a cell measured often (where the engine really departs from the line,
e.g. a GPU's flat cost up to some batch size) follows its own measurements.
"""

from __future__ import annotations

import threading

# Priors used only until two distinct shapes have been measured (warm-up measures several at load):
# a few milliseconds per call plus ~0.1 ms per padded token, the order of ONNX Runtime fp32
# all-MiniLM-L6-v2 on an idle 2-core CPU (../shared/ENVIRONMENT.md: ~35-40 sequences/s at 128 tokens).
PRIOR_OVERHEAD_S = 2e-3
PRIOR_PER_TOKEN_S = 1e-4
FIT_WEIGHT_CAP = 8  # a cell's weight in the linear fit: its measurement count, at most this
SHRINK_MEASUREMENTS = 4.0  # a cell's own value gets half the weight after this many measurements
FLOOR_RISE = 0.02  # the floor moves up by this fraction of the gap per measurement above it

Cell = tuple[int, int]


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
        self._lock = threading.Lock()

    def observe(self, batch: int, length: int, seconds: float) -> None:
        """Record one measured execution of a [batch, length] batch, in seconds."""
        if seconds < 0 or batch < 1 or length < 1:
            return
        cell = (batch, length)
        with self._lock:
            old = self._expected.get(cell)
            self._expected[cell] = seconds if old is None else old + self.alpha * (seconds - old)
            low = self._floor.get(cell)
            self._floor[cell] = seconds if low is None or seconds < low else low + FLOOR_RISE * (seconds - low)
            self._counts[cell] = self._counts.get(cell, 0) + 1
            self._fits.clear()

    def linear(self, *, floor: bool = False) -> tuple[float, float]:
        """(overhead_s, per_token_s) of the current fit of one statistic, or the prior."""
        with self._lock:
            return self._fit_locked(floor)

    def _fit_locked(self, floor: bool) -> tuple[float, float]:
        fit = self._fits.get(floor)
        if fit is None:
            fit = self._fits[floor] = self._solve(self._floor if floor else self._expected)
        return fit

    def _solve(self, cells: dict[Cell, float]) -> tuple[float, float]:
        """Weighted least squares of cell values on tokens = batch * length."""
        w = x = y = xx = xy = 0.0
        for (batch, length), seconds in cells.items():
            weight = float(min(self._counts[(batch, length)], FIT_WEIGHT_CAP))
            tokens = float(batch * length)
            w, x, y = w + weight, x + weight * tokens, y + weight * seconds
            xx, xy = xx + weight * tokens * tokens, xy + weight * tokens * seconds
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
