"""FastPath scheduler metrics on Triton's metrics endpoint (``pb_utils.MetricFamily``).

In Triton 2.51's python backend (verified with a probe model) ``MetricFamily`` offers
COUNTER, GAUGE and HISTOGRAM, and a HISTOGRAM metric takes its ``buckets`` at creation. A family is
removed from the endpoint when its Python object is garbage-collected, so this class keeps every
family and metric alive until :meth:`SchedulerMetrics.close`.

Names follow Prometheus' conventions: base units (seconds, bytes, ratios 0-1 in ``_ratio``),
counters end in ``_total``, latencies are histograms (``_bucket``/``_sum``/``_count``).

Labels. Every series carries ``model``, ``version`` and ``pid`` (the stub process that publishes it;
:func:`stub_labels`); execution time also ``batch_size`` and ``seq_length``; the per-text time
counters ``path``: ``queued`` for texts the scheduler ran after ``execute()`` had returned (their
time is outside Triton's request statistics, which stop when ``execute()`` returns) and ``inline``
for texts ``execute()`` ran itself (inside Triton's ``compute_infer``). Sum over ``pid`` (and
``path``) for a per-model figure, e.g. ``sum by (model, version) (rate(fastpath_batch_size_sum[1m]))``.

Why ``pid``. In Triton 2.51 two ``pb_utils`` metrics with the same family name and labels share one
prometheus-cpp series, but each stub's family counts references to it on its own
(``MetricFamily::Remove`` in triton-inference-server/core src/metric_family.cc). So when one stub
drops the shared series (a failed or replaced load, one of two instances unloading) the others keep a
dangling pointer and their next increment writes freed memory: tritonserver dies with
"malloc_consolidate(): unaligned fastbin chunk detected" / SIGSEGV after a failed reload followed by
a good one (upstream triton-inference-server/server#8663, open). A label unique to the
stub process means no two stubs ever share a series. The cost: a reload or a second instance is a
new series (the same as prometheus_client's multiprocess ``pid`` label).

Families:
    fastpath_batch_size                      HISTOGRAM  real texts per engine call
    fastpath_batch_padding_ratio             HISTOGRAM  (padded - real tokens) / padded tokens, per call
    fastpath_padded_tokens_total             COUNTER    tokens the engine processed (filler rows included)
    fastpath_real_tokens_total               COUNTER    tokens of real texts
    fastpath_queue_delay_seconds             HISTOGRAM  accept -> dispatch of the oldest text of each
                                                        engine call
    fastpath_queue_duration_seconds_total    COUNTER    accept -> dispatch summed over every text, by
                                                        ``path`` (like Triton's
                                                        nv_inference_queue_duration_us); its rate over
                                                        ``fastpath_batch_size_sum``'s is the mean queue
                                                        delay per text
    fastpath_text_execution_seconds_total    COUNTER    engine time of each text's call summed over
                                                        texts (a call of 8 texts for 10 ms adds 80 ms),
                                                        by ``path``: over ``fastpath_batch_size_sum``,
                                                        the mean time a text's batch ran
    fastpath_rejected_texts_total            COUNTER    texts of requests answered with an error, by
                                                        ``reason`` (queue_full, shutdown, timeout,
                                                        cancelled); a request counts all its texts, so a
                                                        cancelled or shut-down one also counts any that
                                                        already ran (and are in fastpath_batch_size)
    fastpath_invalid_requests_total          COUNTER    requests answered 400 for bad input
    fastpath_batch_execution_seconds         HISTOGRAM  engine time per call, per (batch_size, seq_length) bucket
    fastpath_batch_failures_total            COUNTER    engine calls that raised

Cost. Every ``pb_utils`` metric call (``observe``, ``increment``, ``set``) is a synchronous
stub-to-server round trip; on the H200, publishing per text and per batch from the request path cost
18% of served throughput (docs/benchmarks/triton_gpu_h200.md). So by default
(``metrics_interval_ms`` > 0) the request path only records into local buffers, a few list appends
per engine call, and :class:`MetricsFlusher` publishes them from its own thread every interval and
at unload: counters as one increment per interval, histograms one observation per engine call. A
scrape may trail the last batches by up to one interval. ``metrics_interval_ms = 0`` publishes on
the request path as it happens.
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
                counts, self._counts = list(self._counts.values()), {}
                observations, self._observations = self._observations, []
            if self._make is None:  # closed
                return
            for metric, value in counts:
                metric.increment(float(value))
            for metric, value in observations:
                metric.observe(value)

    def dispatched(self, batch: Batch, queue_delays_s: Sequence[float], *, inline: bool = False) -> None:
        self._observe(self._batch_size, float(batch.texts))
        padded, real = batch.padded_tokens, batch.real_tokens
        self._observe(self._padding, (padded - real) / padded if padded else 0.0)
        self._increment(self._padded_tokens, float(padded))
        self._increment(self._real_tokens, float(real))
        if queue_delays_s:
            self._observe(self._queue_delay, max(queue_delays_s))
            self._increment(self._queue_duration[_path(inline)], sum(queue_delays_s))

    def batch_done(self, batch: Batch, seconds: float, error: BaseException | None, *, inline: bool = False) -> None:
        if error is not None:
            self._increment(self._failures, 1.0)
            return
        key = (batch.batch_size, batch.length)
        with self._lock:
            metric = self._execution.get(key)
            if metric is None:
                metric = self._execution[key] = self._make(
                    "fastpath_batch_execution_seconds", "Engine time per call by batch bucket and padded length, seconds",
                    self._histogram, SECONDS_BUCKETS, batch_size=str(key[0]), seq_length=str(key[1]))
        self._observe(metric, seconds)
        if batch.texts:
            self._increment(self._text_execution[_path(inline)], seconds * batch.texts)

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
            self._counts, self._observations = {}, []
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
