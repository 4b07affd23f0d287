"""Online cost model: predicted engine time of a batch shape (batch bucket x length bucket).

Each (batch size, padded length) cell keeps an exponentially weighted moving average (EWMA) of
its measured execution times. Every measurement also feeds a linear fit
``overhead_s + per_token_s * batch * length`` (exponentially weighted least squares, so it follows
drift); before two distinct shapes were measured, a prior stands in for it. The linear form is what
a BERT encoder costs to first order: a fixed per-call overhead plus work proportional to the padded
tokens (attention's length^2 term is small at these lengths).

A cell's prediction shrinks its EWMA toward the fit by its number of measurements ``n``:
``fit + n / (n + SHRINK_MEASUREMENTS) * (ewma - fit)`` (empirical-Bayes style). A cell seen once
or twice on a noisy, shared machine cannot then look cheaper than its neighbours by chance and
steer batches into needless padding, while a cell measured often (where the engine really departs
from the line, e.g. a GPU's flat cost up to some batch size) follows its own measurements.
"""

from __future__ import annotations

import threading

# Priors used only until two distinct shapes have been measured (warm-up measures several at load).
# Measured on this 2-core CPU with ONNX Runtime fp32 all-MiniLM-L6-v2 (docs/benchmarks/scheduler_cpu.md):
# a few milliseconds per call plus ~0.1 ms per padded token.
PRIOR_OVERHEAD_S = 2e-3
PRIOR_PER_TOKEN_S = 1e-4
_FIT_DECAY = 0.98  # weight kept by old points in the linear fit per new measurement
SHRINK_MEASUREMENTS = 4.0  # a cell's EWMA gets half the weight after this many measurements


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
        self._cells: dict[tuple[int, int], float] = {}
        self._counts: dict[tuple[int, int], int] = {}
        self._prior = (prior_overhead_s, prior_per_token_s)
        # exponentially weighted sums for least squares of seconds on tokens = batch * length
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._lock = threading.Lock()

    def observe(self, batch: int, length: int, seconds: float) -> None:
        """Record one measured execution of a [batch, length] batch, in seconds."""
        if seconds < 0 or batch < 1 or length < 1:
            return
        tokens = float(batch * length)
        with self._lock:
            old = self._cells.get((batch, length))
            self._cells[(batch, length)] = seconds if old is None else old + self.alpha * (seconds - old)
            self._counts[(batch, length)] = self._counts.get((batch, length), 0) + 1
            d = _FIT_DECAY
            self._w = self._w * d + 1.0
            self._x = self._x * d + tokens
            self._y = self._y * d + seconds
            self._xx = self._xx * d + tokens * tokens
            self._xy = self._xy * d + tokens * seconds

    def linear(self) -> tuple[float, float]:
        """(overhead_s, per_token_s) of the current fit, or the prior before the fit is determined."""
        with self._lock:
            return self._linear_locked()

    def _linear_locked(self) -> tuple[float, float]:
        w = self._w
        variance = self._xx * w - self._x * self._x
        if w <= 0 or variance <= 1e-9 * max(1.0, self._xx * w):
            return self._prior
        slope = (self._xy * w - self._x * self._y) / variance
        intercept = (self._y - slope * self._x) / w
        if slope <= 0:  # noise can tilt the fit; never predict that more tokens are free
            return self._prior
        return max(0.0, intercept), slope

    def estimate(self, batch: int, length: int) -> float:
        """Predicted seconds for a [batch, length] batch: the linear fit, moved toward the cell's EWMA."""
        with self._lock:
            overhead, per_token = self._linear_locked()
            fit = overhead + per_token * batch * length
            cell = self._cells.get((batch, length))
            if cell is None:
                return fit
            count = self._counts[(batch, length)]
        return fit + count / (count + SHRINK_MEASUREMENTS) * (cell - fit)

    def measured(self) -> dict[tuple[int, int], float]:
        """A copy of the per-cell EWMAs, {(batch, length): seconds}."""
        with self._lock:
            return dict(self._cells)
