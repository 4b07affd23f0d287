"""FastPath scheduler metrics on Triton's metrics endpoint (``pb_utils.MetricFamily``).

Verified on this Triton 2.51 python backend (probe model, 2026-11-29): ``MetricFamily`` offers
COUNTER, GAUGE and HISTOGRAM, and a HISTOGRAM metric takes its ``buckets`` at creation. A family is
removed from the endpoint when its Python object is garbage-collected, so this class keeps every
family and metric alive until :meth:`SchedulerMetrics.close`.

Families (labels: ``model``, ``version``; execution time also ``batch_size`` and ``seq_length``):
    fastpath_batch_size                      HISTOGRAM  real texts per engine call
    fastpath_batch_padding_fraction          HISTOGRAM  (padded - real tokens) / padded tokens, per call
    fastpath_padded_tokens_total             COUNTER    tokens the engine processed (filler rows included)
    fastpath_real_tokens_total               COUNTER    tokens of real texts
    fastpath_queue_delay_us                  HISTOGRAM  accept -> dispatch, per text, microseconds
    fastpath_rejected_texts_total            COUNTER    texts answered without running, by ``reason``
                                                        (queue_full, shutdown, timeout, cancelled)
    fastpath_batch_execution_us              HISTOGRAM  engine time per call, per (batch_size, seq_length) bucket
    fastpath_batch_failures_total            COUNTER    engine calls that raised
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from fastpath.scheduling import Batch, SchedulerObserver

REJECT_REASONS = ("queue_full", "shutdown", "timeout", "cancelled")
# microsecond histogram buckets: 100 us .. ~6.5 s in x4 steps
US_BUCKETS = [100.0 * 4**k for k in range(9)]
FRACTION_BUCKETS = [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 0.9]


class SchedulerMetrics(SchedulerObserver):
    """Publishes scheduler events as Triton custom metrics.

    Args:
        pb_utils: the ``triton_python_backend_utils`` module.
        model: model name label.
        version: model version label.
        batch_buckets: the engine's batch sizes (histogram buckets of ``fastpath_batch_size``).
    """

    def __init__(self, pb_utils: Any, *, model: str, version: str, batch_buckets: Sequence[int]) -> None:
        family = pb_utils.MetricFamily
        self._labels = {"model": model, "version": version}
        self._families: dict[str, Any] = {}
        self._lock = threading.Lock()

        def make(name: str, description: str, kind: Any, buckets: list[float] | None = None, **labels: str) -> Any:
            if name not in self._families:
                self._families[name] = family(name=name, description=description, kind=kind)
            extra = {"buckets": buckets} if buckets is not None else {}
            return self._families[name].Metric(labels={**self._labels, **labels}, **extra)

        self._make = make
        self._histogram = family.HISTOGRAM
        self._batch_size = make("fastpath_batch_size", "Real texts per engine call", family.HISTOGRAM,
                                [float(b) for b in batch_buckets])
        self._padding = make("fastpath_batch_padding_fraction", "Padded tokens that are not real text, per engine call",
                             family.HISTOGRAM, FRACTION_BUCKETS)
        self._padded_tokens = make("fastpath_padded_tokens_total", "Tokens processed by the engine, padding included",
                                   family.COUNTER)
        self._real_tokens = make("fastpath_real_tokens_total", "Tokens of real texts processed by the engine", family.COUNTER)
        self._queue_delay = make("fastpath_queue_delay_us", "Queue delay per text from accept to dispatch, microseconds",
                                 family.HISTOGRAM, US_BUCKETS)
        self._failures = make("fastpath_batch_failures_total", "Engine calls that failed", family.COUNTER)
        # Triton 2.51 counts a request answered with an error through its response sender as a success
        # (nv_inference_request_success), so bad input is visible only here.
        self._invalid = make("fastpath_invalid_requests_total", "Requests answered 400 for bad input", family.COUNTER)
        self._rejected = {
            reason: make("fastpath_rejected_texts_total", "Texts answered with an error without running",
                         family.COUNTER, reason=reason)
            for reason in REJECT_REASONS
        }
        self._execution: dict[tuple[int, int], Any] = {}

    def dispatched(self, batch: Batch, queue_delays_s: Sequence[float]) -> None:
        self._batch_size.observe(float(len(batch.items)))
        padded, real = batch.padded_tokens, batch.real_tokens
        self._padding.observe((padded - real) / padded if padded else 0.0)
        self._padded_tokens.increment(float(padded))
        self._real_tokens.increment(float(real))
        for delay_s in queue_delays_s:
            self._queue_delay.observe(delay_s * 1e6)

    def batch_done(self, batch: Batch, seconds: float, error: BaseException | None) -> None:
        if error is not None:
            self._failures.increment(1.0)
            return
        key = (batch.batch_size, batch.length)
        with self._lock:
            metric = self._execution.get(key)
            if metric is None:
                metric = self._execution[key] = self._make(
                    "fastpath_batch_execution_us", "Engine time per call by batch bucket and padded length, microseconds",
                    self._histogram, US_BUCKETS, batch_size=str(key[0]), seq_length=str(key[1]))
        metric.observe(seconds * 1e6)

    def rejected(self, reason: str, texts: int) -> None:
        metric = self._rejected.get(reason)
        if metric is not None:
            metric.increment(float(texts))

    def invalid_request(self) -> None:
        self._invalid.increment(1.0)

    def close(self) -> None:
        """Drop every metric, then every family (they leave the metrics endpoint); idempotent.

        Must run in ``finalize``: a ``pb_utils`` metric still alive when the stub's interpreter shuts
        down is destroyed after the stub's link to the server is gone, and the stub died with a
        segmentation fault at every unload (tests/e2e/test_serve_cli.py checks the log).
        """
        with self._lock:
            self._execution.clear()
            self._rejected = {}
            self._batch_size = self._padding = self._padded_tokens = self._real_tokens = None
            self._queue_delay = self._failures = self._invalid = None
            self._families.clear()
            self._make = None
