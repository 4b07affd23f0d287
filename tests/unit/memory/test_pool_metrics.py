"""PoolMetrics bookkeeping against a recording stand-in for pb_utils' metric API.

The real Triton path (custom metrics on /metrics) is covered by tests/e2e/test_pool_metrics.py.
"""

from __future__ import annotations

from fastpath.triton.pool_metrics import COUNTERS, GAUGES, PoolMetrics


class RecordingMetric:
    def __init__(self, kind):
        self.kind, self.value = kind, 0.0

    def set(self, value):
        assert self.kind == "gauge", "Triton counters cannot be set"
        self.value = value

    def increment(self, value):
        assert value > 0 or self.kind == "gauge", "Triton counters only increase"
        self.value += value


class RecordingFamily:
    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, {}

    def Metric(self, labels):  # noqa: N802 - pb_utils API name
        metric = RecordingMetric(self.kind)
        self.metrics[tuple(sorted(labels.items()))] = metric
        return metric


class RecordingPbUtils:
    class MetricFamily(RecordingFamily):
        GAUGE, COUNTER = "gauge", "counter"

        def __init__(self, name, description, kind):
            super().__init__(name, description, kind)
            RecordingPbUtils.families[name] = self

    families: dict = {}


def _value(name, pool="host"):
    family = RecordingPbUtils.families[name]
    return next(metric.value for labels, metric in family.metrics.items() if ("pool", pool) in labels)


def test_gauges_follow_and_counters_advance_by_deltas(make_pool):
    RecordingPbUtils.families = {}
    host, device = make_pool(), make_pool()
    device.name = "device"
    metrics = PoolMetrics(RecordingPbUtils, model="m", pools=[host, device])
    assert len(RecordingPbUtils.families) == len(GAUGES) + len(COUNTERS)
    held = host.lease(5000)
    metrics.update()
    assert (_value("fastpath_pool_bytes_in_use"), _value("fastpath_pool_leases_total")) == (8192, 1)
    held.release()
    with host.lease(5000):
        pass
    metrics.update()
    metrics.update()  # no change: counters must not move
    assert _value("fastpath_pool_bytes_in_use") == 0
    assert (_value("fastpath_pool_leases_total"), _value("fastpath_pool_hits_total"), _value("fastpath_pool_misses_total")) == (2, 1, 1)
    assert _value("fastpath_pool_high_water_bytes") == 8192 and _value("fastpath_pool_capacity_bytes") == 64 * 1024
    assert _value("fastpath_pool_leases_total", pool="device") == 0
