"""FastPath scheduler metrics on Triton's metrics endpoint (``pb_utils.MetricFamily``).

Triton 2.51's python backend offers COUNTER, GAUGE and HISTOGRAM (buckets given at creation) and removes a family
from the endpoint when its Python object is garbage-collected, so :class:`SchedulerMetrics` keeps every family and
metric alive until :meth:`SchedulerMetrics.close`. Names follow Prometheus' conventions (base units, counters end
in ``_total``, latencies are histograms). Every series carries ``model``, ``version`` and ``pid``
(:func:`stub_labels`): two stubs sharing a series crash tritonserver (docs/known-issues.md), so sum over ``pid``
for a per-model figure. Every ``pb_utils`` metric call is a stub-to-server round trip, so with
``metrics_interval_ms`` > 0 the request path only records locally and :class:`MetricsFlusher` publishes every
interval and at unload (a scrape may trail by one interval). Each family, its labels and the publishing cost:
docs/design/scheduler.md#metrics-fastpathtritonmetrics-labels-model-version-pid.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fastpath.scheduling import Batch, SchedulerObserver

LOG = logging.getLogger(__name__)

REJECT_REASONS = ("queue_full", "shutdown", "timeout", "cancelled")
PATHS = ("queued", "inline")
# latency histogram buckets in seconds: 100 us .. ~6.5 s in x4 steps
SECONDS_BUCKETS = [1e-4 * 4**k for k in range(9)]
RATIO_BUCKETS = [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 0.9]


def _path(inline: bool) -> str:
    """The ``path`` label: ``inline`` (``execute()`` ran the texts) or ``queued`` (the scheduler did, later)."""
    return "inline" if inline else "queued"


def stub_labels() -> dict[str, str]:
    """``{"pid": <this process id>}``: the label that keeps each stub's metric series its own (see
    the module docstring: shared series crash Triton 2.51 when one stub drops them)."""
    return {"pid": str(os.getpid())}


def execution_labels(batch_size: int, length: int, batch_sizes: Sequence[int]) -> tuple[int, int]:
    """The (batch_size, seq_length) labels of an engine call of ``batch_size`` rows padded to ``length``: the
    smallest of ``batch_sizes`` that holds the rows (the rows themselves past the largest), and the length rounded
    up to a power of two. Exact values (a CPU batch runs its real rows, padded to its longest text) made up to
    64 x 256 series of 12 lines per stub; these are at most len(batch_sizes) x ~12."""
    bucket = next((size for size in batch_sizes if size >= batch_size), batch_size)
    return bucket, 1 << max(length - 1, 0).bit_length()


class SchedulerMetrics(SchedulerObserver):
    """Publishes scheduler events as Triton custom metrics.

    Args:
        pb_utils: the ``triton_python_backend_utils`` module.
        model: model name label.
        version: model version label (each series also gets :func:`stub_labels`).
        batch_sizes: the scheduler's batch sizes (histogram buckets of ``fastpath_batch_size``).
        buffered: record into local buffers that :meth:`flush` publishes (from a
            :class:`MetricsFlusher`); False: publish each update at once, on the caller's thread.
    """

    def __init__(self, pb_utils: Any, *, model: str, version: str, batch_sizes: Sequence[int],
                 buffered: bool = False) -> None:
        family = pb_utils.MetricFamily
        self._labels = {"model": model, "version": version, **stub_labels()}
        self._families: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._buffered = buffered
        self._counts: dict[int, list[Any]] = {}  # id(metric) -> [metric, pending increment]
        self._observations: list[tuple[Any, float]] = []
        self._inline: list[tuple[int, int, int, int, float, float]] = []  # ran_inline's records, until a flush

        def make(name: str, description: str, kind: Any, buckets: list[float] | None = None, **labels: str) -> Any:
            if name not in self._families:
                self._families[name] = family(name=name, description=description, kind=kind)
            extra = {"buckets": buckets} if buckets is not None else {}
            return self._families[name].Metric(labels={**self._labels, **labels}, **extra)

        self._make = make
        self._histogram = family.HISTOGRAM
        self._batch_size = make("fastpath_batch_size", "Real texts per engine call", family.HISTOGRAM,
                                [float(b) for b in batch_sizes])
        self._padding = make("fastpath_batch_padding_ratio", "Padded tokens that are not real text, per engine call",
                             family.HISTOGRAM, RATIO_BUCKETS)
        self._padded_tokens = make("fastpath_padded_tokens_total", "Tokens processed by the engine, padding included",
                                   family.COUNTER)
        self._real_tokens = make("fastpath_real_tokens_total", "Tokens of real texts processed by the engine", family.COUNTER)
        self._queue_delay = make("fastpath_queue_delay_seconds", "Queue delay of the oldest text of each engine call, "
                                 "accept to dispatch, seconds", family.HISTOGRAM, SECONDS_BUCKETS)
        self._queue_duration = {path: make("fastpath_queue_duration_seconds_total", "Queue delay from accept to dispatch "
                                           "summed over every text, seconds", family.COUNTER, path=path) for path in PATHS}
        self._text_execution = {path: make("fastpath_text_execution_seconds_total", "Engine time of each text's call "
                                           "summed over texts, seconds", family.COUNTER, path=path) for path in PATHS}
        self._failures = make("fastpath_batch_failures_total", "Engine calls that failed", family.COUNTER)
        # Triton 2.51 counts a request answered with an error through its response sender as a success
        # (nv_inference_request_success), so bad input is visible only here.
        self._invalid = make("fastpath_invalid_requests_total", "Requests answered 400 for bad input", family.COUNTER)
        self._rejected = {
            reason: make("fastpath_rejected_texts_total", "Texts of requests answered with an error instead of their rows "
                         "(all of a request's texts, also any that already ran)",
                         family.COUNTER, reason=reason)
            for reason in REJECT_REASONS
        }
        self._execution: dict[tuple[int, int], Any] = {}
        self._batch_sizes = sorted(batch_sizes)

    def _increment(self, metric: Any, value: float) -> None:
        if not self._buffered:
            metric.increment(value)
            return
        with self._lock:
            pending = self._counts.get(id(metric))
            if pending is None:
                self._counts[id(metric)] = [metric, value]
            else:
                pending[1] += value

    def _observe(self, metric: Any, value: float) -> None:
        if not self._buffered:
            metric.observe(value)
            return
        with self._lock:
            self._observations.append((metric, value))

    def flush(self) -> None:
        """Publish what was recorded since the last flush (buffered mode; a no-op otherwise).

        Runs on :class:`MetricsFlusher`'s thread: these are the round trips to the server.
        """
        with self._publish_lock:
            with self._lock:
                inline, self._inline = self._inline, []
            if self._make is None:  # closed
                return
            for texts, real, batch_size, length, delay_s, seconds in inline:
                self._record_dispatch(texts, real, batch_size * length, delay_s, delay_s * texts, True)
                self._record_execution(batch_size, length, texts, seconds, True)
            with self._lock:
                counts, self._counts = list(self._counts.values()), {}
                observations, self._observations = self._observations, []
            if self._make is None:  # closed
                return
            for metric, value in counts:
                metric.increment(float(value))
            for metric, value in observations:
                metric.observe(value)

    def dispatched(self, batch: Batch, queue_delays_s: Sequence[float], *, inline: bool = False) -> None:
        oldest = max(queue_delays_s) if queue_delays_s else None
        self._record_dispatch(batch.texts, batch.real_tokens, batch.padded_tokens, oldest, sum(queue_delays_s), inline)

    def _record_dispatch(self, texts: int, real: int, padded: int, oldest_delay_s: float | None, total_delay_s: float,
                         inline: bool) -> None:
        self._observe(self._batch_size, float(texts))
        self._observe(self._padding, (padded - real) / padded if padded else 0.0)
        self._increment(self._padded_tokens, float(padded))
        self._increment(self._real_tokens, float(real))
        if oldest_delay_s is not None:
            self._observe(self._queue_delay, oldest_delay_s)
            self._increment(self._queue_duration[_path(inline)], total_delay_s)

    def batch_done(self, batch: Batch, seconds: float, error: BaseException | None, *, inline: bool = False) -> None:
        if error is not None:
            self._increment(self._failures, 1.0)
            return
        self._record_execution(batch.batch_size, batch.length, batch.texts, seconds, inline)

    def ran_inline(self, batch: Batch, queue_delay_s: float, seconds: float) -> None:
        """Buffered: one record per engine call, which :meth:`flush` turns into the updates of :meth:`dispatched`
        and :meth:`batch_done` on the metrics thread (the serving thread of a lone request pays one lock, not ten)."""
        if not self._buffered:
            super().ran_inline(batch, queue_delay_s, seconds)
            return
        record = (batch.texts, batch.real_tokens, batch.batch_size, batch.length, queue_delay_s, seconds)
        with self._lock:
            self._inline.append(record)

    def _record_execution(self, batch_size: int, length: int, texts: int, seconds: float, inline: bool) -> None:
        key = execution_labels(batch_size, length, self._batch_sizes)
        with self._lock:
            metric = self._execution.get(key)
            if metric is None:
                metric = self._execution[key] = self._make(
                    "fastpath_batch_execution_seconds", "Engine time per call by batch bucket and padded length "
                    "(rounded up to a power of two), seconds", self._histogram, SECONDS_BUCKETS,
                    batch_size=str(key[0]), seq_length=str(key[1]))
        self._observe(metric, seconds)
        if texts:
            self._increment(self._text_execution[_path(inline)], seconds * texts)

    def rejected(self, reason: str, texts: int) -> None:
        metric = self._rejected.get(reason)
        if metric is not None:
            self._increment(metric, float(texts))

    def invalid_request(self) -> None:
        self._increment(self._invalid, 1.0)

    def close(self) -> None:
        """Drop every metric, then every family (they leave the metrics endpoint); idempotent.

        Must run in ``finalize``: a ``pb_utils`` metric still alive when the stub's interpreter shuts
        down is destroyed after the stub's link to the server is gone, and the stub died with a
        segmentation fault at every unload (tests/e2e/test_serve_cli.py checks the log).
        """
        with self._publish_lock, self._lock:
            self._counts, self._observations, self._inline = {}, [], []
            self._execution.clear()
            self._rejected = {}
            self._batch_size = self._padding = self._padded_tokens = self._real_tokens = None
            self._queue_delay = self._failures = self._invalid = None
            self._queue_duration = self._text_execution = dict.fromkeys(PATHS)
            self._families.clear()
            self._make = None


class MetricsFlusher:
    """Runs ``flushes`` (e.g. :meth:`SchedulerMetrics.flush`, ``PoolMetrics.update``) every ``interval_s``
    on one daemon thread, and once more at :meth:`close`; an exception in one is logged, never raised.

    Args:
        flushes: callables without arguments.
        interval_s: seconds between runs (> 0).
        name: thread name.
    """

    def __init__(self, flushes: Sequence[Callable[[], None]], interval_s: float, name: str = "fastpath-metrics") -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._flushes = list(flushes)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for flush in self._flushes:
            try:
                flush()
            except Exception:  # metrics must never take the model down
                LOG.exception("publishing FastPath metrics failed")

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._run()

    def close(self) -> None:
        """Stop the thread, then publish what is left (call before closing the metrics); idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._run()
