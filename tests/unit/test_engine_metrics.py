"""EngineMetrics bookkeeping against a recording stand-in for pb_utils' metric API (tests/unit/memory/test_pool_metrics.py),
and how a scheduled model publishes it beside its pool metrics."""

from __future__ import annotations

import dataclasses

from fastpath.engines.onnxruntime.image_cuda import EngineStats
from fastpath.scheduling.config import SchedulerConfig
from fastpath.triton.engine_metrics import COUNTERS, EngineMetrics
from fastpath.triton.scheduled import metrics_flusher
from tests.unit.memory.test_pool_metrics import RecordingPbUtils


def _value(name):
    (metric,) = RecordingPbUtils.families[f"fastpath_engine_{name}_total"].metrics.values()
    return metric.value


def test_counters_follow_the_engine_statistics_by_their_increase_and_stop_at_close():
    """Each fastpath_engine_*_total equals the engine's cumulative statistic after every update (the copy
    seconds as floats), labelled with the model, the device and the stub's pid; after close nothing moves."""
    RecordingPbUtils.families = {}
    current = EngineStats()
    metrics = EngineMetrics(RecordingPbUtils, model="text_detection", device="gpu:0", stats=lambda: current)
    assert set(RecordingPbUtils.families) == {f"fastpath_engine_{name}_total" for name in COUNTERS}
    (labels,) = RecordingPbUtils.families["fastpath_engine_h2d_bytes_total"].metrics
    assert {key for key, _ in labels} == {"model", "device", "pid"} and ("device", "gpu:0") in labels
    current = dataclasses.replace(current, h2d_bytes=23_187_456, h2d_s=0.00045, graph_runs=1)
    metrics.update()
    current = dataclasses.replace(current, h2d_bytes=2 * 23_187_456, h2d_s=0.0009, d2h_bytes=30_916_608, d2h_s=0.0006,
                                  graph_runs=2, eager_runs=1)
    metrics.update()
    assert (_value("h2d_bytes"), _value("graph_runs"), _value("eager_runs"), _value("d2h_bytes")) == (2 * 23_187_456, 2, 1, 30_916_608)
    assert abs(_value("h2d_seconds") - 0.0009) < 1e-12 and abs(_value("d2h_seconds") - 0.0006) < 1e-12
    assert _value("d2d_bytes") == 0 and _value("capture_runs") == 0
    metrics.close()
    current = dataclasses.replace(current, h2d_bytes=10**12)
    metrics.update()
    assert _value("h2d_bytes") == 2 * 23_187_456


def test_without_a_flush_interval_the_per_batch_hook_updates_every_exporter():
    """metrics_interval_ms 0: no flusher thread, and the hook the batch handler calls after each batch runs each
    exporter's update (pool and engine metrics); with no exporter there is no hook."""
    calls = []

    class Exporter:
        def __init__(self, name):
            self.name = name

        def update(self):
            calls.append(self.name)

    flusher, hook = metrics_flusher(SchedulerConfig(metrics_interval_ms=0), None, [Exporter("pool"), None, Exporter("engine")], "m")
    assert flusher is None
    hook()
    assert calls == ["pool", "engine"]
    assert metrics_flusher(SchedulerConfig(metrics_interval_ms=0), None, [None, None], "m") == (None, None)
