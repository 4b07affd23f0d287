"""SchedulerMetrics buffering and MetricsFlusher against a recording stand-in for pb_utils' metric API.

Triton's own /metrics path is covered by tests/e2e/test_scheduler.py (the default, buffered mode).
"""

from __future__ import annotations

import logging
import os

from pytest import approx

from fastpath.scheduling import Batch, Ticket, WorkItem
from fastpath.triton.metrics import MetricsFlusher, SchedulerMetrics, execution_labels


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
    return Batch(items=items, batch_size=size, length=length, rule="full", formed_s=0.0, predicted_s=0.001)


def test_buffered_metrics_publish_nothing_until_flush_then_everything_once():
    RecordingPbUtils.calls.clear()
    metrics = SchedulerMetrics(RecordingPbUtils, model="m", version="1", batch_sizes=(1, 2, 4), buffered=True)
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
    assert _metric("fastpath_queue_duration_seconds_total", path="queued").value == approx(3 * 0.006)
    assert _metric("fastpath_queue_delay_seconds").observations == approx([0.003] * 3)  # the oldest text of each batch
    assert _metric("fastpath_batch_size").observations == [3.0] * 3
    assert _metric("fastpath_batch_execution_seconds", batch_size="4", seq_length="16").observations == [0.005] * 3
    # each text counts its call's engine time: 3 calls x 3 texts x 5 ms
    assert _metric("fastpath_text_execution_seconds_total", path="queued").value == approx(3 * 3 * 0.005)
    assert _metric("fastpath_text_execution_seconds_total", path="inline").value == 0
    assert _metric("fastpath_rejected_texts_total", reason="timeout").value == 2
    assert _metric("fastpath_invalid_requests_total").value == 1
    # every series names its stub process, so two stubs never share one (triton-inference-server/server#8663, docs/design/scheduler.md)
    for family in RecordingPbUtils.families.values():
        assert all(("pid", str(os.getpid())) in labels for labels in family.metrics), family.name
    counters = RecordingPbUtils.calls.count("increment")
    assert counters == 6  # one increment per counter per flush, however many batches
    RecordingPbUtils.calls.clear()
    metrics.flush()
    assert RecordingPbUtils.calls == []  # nothing new, nothing sent
    metrics.close()
    metrics.dispatched(_batch(1, 5, 1, 16), [0.001])
    metrics.flush()  # closed: buffered updates are dropped, nothing is sent
    assert RecordingPbUtils.calls == []


def test_engine_time_series_are_bounded_by_batch_buckets_and_powers_of_two():
    """A CPU batch runs its real rows padded to its longest text, so exact labels would make a series for every
    (rows, length) pair. Invariant: a call is labelled with the smallest batch bucket holding its rows and its
    length rounded up to a power of two; calls of 3-4 rows and lengths 9-16 share one series."""
    RecordingPbUtils.calls.clear()
    metrics = SchedulerMetrics(RecordingPbUtils, model="m", version="1", batch_sizes=(1, 2, 4, 8), buffered=False)
    for rows, length in ((3, 9), (4, 16), (3, 13)):
        metrics.batch_done(_batch(rows, length, rows, length), 0.002, None)
    metrics.batch_done(_batch(5, 17, 5, 17), 0.004, None)
    assert _metric("fastpath_batch_execution_seconds", batch_size="4", seq_length="16").observations == [0.002] * 3
    assert _metric("fastpath_batch_execution_seconds", batch_size="8", seq_length="32").observations == [0.004]
    assert [execution_labels(n, length, (1, 2, 4)) for n, length in ((1, 1), (4, 256), (6, 257))] == [(1, 1), (4, 256), (6, 512)]
    metrics.close()


def test_unbuffered_metrics_publish_on_the_calling_thread():
    RecordingPbUtils.calls.clear()
    metrics = SchedulerMetrics(RecordingPbUtils, model="m", version="1", batch_sizes=(1, 2), buffered=False)
    metrics.dispatched(_batch(2, 7, 2, 16), [0.004, 0.001])
    assert _metric("fastpath_real_tokens_total").value == 14 and _metric("fastpath_queue_delay_seconds").observations == [0.004]
    metrics.close()


def test_inline_texts_are_counted_apart_from_queued_ones():
    """Texts that execute() ran itself (inside Triton's compute_infer) go to path="inline"; the scheduler's
    to path="queued": a bench subtracts only the queued ones from what Triton's statistics miss."""
    RecordingPbUtils.calls.clear()
    metrics = SchedulerMetrics(RecordingPbUtils, model="m", version="1", batch_sizes=(1, 2, 4), buffered=False)
    inline, queued = _batch(2, 5, 2, 8), _batch(4, 5, 4, 8)
    metrics.dispatched(inline, [0.001, 0.001], inline=True)
    metrics.batch_done(inline, 0.010, None, inline=True)
    metrics.dispatched(queued, [0.002] * 4)
    metrics.batch_done(queued, 0.020, None)
    assert _metric("fastpath_queue_duration_seconds_total", path="inline").value == approx(0.002)
    assert _metric("fastpath_queue_duration_seconds_total", path="queued").value == approx(0.008)
    assert _metric("fastpath_text_execution_seconds_total", path="inline").value == approx(0.020)
    assert _metric("fastpath_text_execution_seconds_total", path="queued").value == approx(0.080)
    assert _metric("fastpath_batch_size").observations == [2.0, 4.0]  # both paths are batches of the engine
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


def _published(buffered: bool, record) -> dict:
    """Every series' value or observations after ``record(metrics)`` and a flush, by family and labels (pid left out)."""
    RecordingPbUtils.calls.clear()
    RecordingPbUtils.families.clear()
    metrics = SchedulerMetrics(RecordingPbUtils, model="m", version="1", batch_sizes=(1, 2, 4), buffered=buffered)
    record(metrics)
    if buffered:
        assert RecordingPbUtils.calls == []  # nothing on the request path
        metrics.flush()
    values = {(name, tuple(item for item in labels if item[0] != "pid")): (metric.value, metric.observations)
              for name, family in RecordingPbUtils.families.items() for labels, metric in family.metrics.items()}
    metrics.close()
    return values


def test_a_call_execute_ran_itself_publishes_what_dispatched_and_batch_done_with_inline_do():
    """Invariant: ran_inline(batch, delay, seconds) publishes exactly what dispatched(batch, [delay] * texts, inline=True)
    and batch_done(batch, seconds, inline=True) publish, buffered (one record, expanded at the flush) or not."""
    calls = [(_batch(3, 10, 4, 16), 0.002, 0.005), (_batch(1, 7, 1, 8), 0.0001, 0.001), (_batch(3, 10, 4, 16), 0.001, 0.004)]

    def separately(metrics):
        for batch, delay, seconds in calls:
            metrics.dispatched(batch, [delay] * batch.texts, inline=True)
            metrics.batch_done(batch, seconds, None, inline=True)

    def together(metrics):
        for batch, delay, seconds in calls:
            metrics.ran_inline(batch, delay, seconds)

    expected = _published(True, separately)
    assert expected[("fastpath_queue_duration_seconds_total", (("model", "m"), ("path", "inline"), ("version", "1")))][0] == approx(0.0091)
    for buffered in (True, False):
        published = _published(buffered, together)
        assert published.keys() == expected.keys()
        for key, (value, observations) in expected.items():
            assert published[key][0] == approx(value) and published[key][1] == approx(observations), key
