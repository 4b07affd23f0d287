"""SchedulerMetrics buffering and MetricsFlusher against a recording stand-in for pb_utils' metric API.

Triton's own /metrics path is covered by tests/e2e/test_scheduler.py (the default, buffered mode).
"""

from __future__ import annotations

import logging
import os

from fastpath.scheduling import Batch, Ticket, WorkItem
from fastpath.triton.metrics import MetricsFlusher, SchedulerMetrics


class RecordingMetric:
    def __init__(self, kind, calls):
        self.kind, self.value, self.observations, self.calls = kind, 0.0, [], calls

    def increment(self, value):
        assert self.kind == "counter" and value > 0, "Triton counters only increase"
        self.calls.append("increment")
        self.value += value

    def observe(self, value):
        assert self.kind == "histogram"
        self.calls.append("observe")
        self.observations.append(value)


class RecordingPbUtils:
    calls: list = []
    families: dict = {}

    class MetricFamily:
        COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

        def __init__(self, name, description, kind):
            self.name, self.kind, self.metrics = name, kind, {}
            RecordingPbUtils.families[name] = self

        def Metric(self, labels, buckets=None):  # noqa: N802 - pb_utils API name
            metric = RecordingMetric(self.kind, RecordingPbUtils.calls)
            self.metrics[tuple(sorted(labels.items()))] = metric
            return metric


def _metric(name, **labels):
    family = RecordingPbUtils.families[name]
    return next(m for key, m in family.metrics.items() if all((k, v) in key for k, v in labels.items()))


def _batch(texts: int, tokens: int, size: int, length: int) -> Batch:
    ticket = Ticket(texts, lambda *args: None)
    items = tuple(WorkItem(ticket, row, tokens) for row in range(texts))
    return Batch(items, size, length, "full", 0.0, 0.001)


def test_buffered_metrics_publish_nothing_until_flush_then_everything_once():
    RecordingPbUtils.calls.clear()
    metrics = SchedulerMetrics(RecordingPbUtils, model="m", version="1", batch_buckets=(1, 2, 4), buffered=True)
    for _ in range(3):
        batch = _batch(3, 10, 4, 16)
        metrics.dispatched(batch, [0.001, 0.002, 0.003])
        metrics.batch_done(batch, 0.005, None)
    metrics.invalid_request()
    metrics.rejected("timeout", 2)
    assert RecordingPbUtils.calls == []  # nothing on the request path
    metrics.flush()
    assert _metric("fastpath_real_tokens_total").value == 90  # 3 batches x 3 texts x 10 tokens
    assert _metric("fastpath_padded_tokens_total").value == 3 * 4 * 16
    assert _metric("fastpath_queue_duration_us").value == 3 * 6000.0
    assert _metric("fastpath_queue_delay_us").observations == [3000.0] * 3  # the oldest text of each batch
    assert _metric("fastpath_batch_size").observations == [3.0] * 3
    assert _metric("fastpath_batch_execution_us", batch_size="4", seq_length="16").observations == [5000.0] * 3
    assert _metric("fastpath_rejected_texts_total", reason="timeout").value == 2
    assert _metric("fastpath_invalid_requests_total").value == 1
    # every series names its stub process, so two stubs never share one (triton-inference-server/server#8663, docs/design/scheduler.md)
    for family in RecordingPbUtils.families.values():
        assert all(("pid", str(os.getpid())) in labels for labels in family.metrics), family.name
    counters = RecordingPbUtils.calls.count("increment")
    assert counters == 5  # one increment per counter per flush, however many batches
    RecordingPbUtils.calls.clear()
    metrics.flush()
    assert RecordingPbUtils.calls == []  # nothing new, nothing sent
    metrics.close()
    metrics.dispatched(_batch(1, 5, 1, 16), [0.001])
    metrics.flush()  # closed: buffered updates are dropped, nothing is sent
    assert RecordingPbUtils.calls == []


def test_unbuffered_metrics_publish_on_the_calling_thread():
    RecordingPbUtils.calls.clear()
    metrics = SchedulerMetrics(RecordingPbUtils, model="m", version="1", batch_buckets=(1, 2), buffered=False)
    metrics.dispatched(_batch(2, 7, 2, 16), [0.004, 0.001])
    assert _metric("fastpath_real_tokens_total").value == 14 and _metric("fastpath_queue_delay_us").observations == [4000.0]
    metrics.close()


def test_flusher_publishes_at_close_and_survives_a_failing_flush(caplog):
    published = []

    def broken():
        raise RuntimeError("server gone")

    flusher = MetricsFlusher([broken, lambda: published.append("pool")], interval_s=3600.0)
    with caplog.at_level(logging.ERROR):
        flusher.close()
        flusher.close()  # idempotent
    assert published == ["pool"]
    assert "publishing FastPath metrics failed" in caplog.text
