"""Export memory-pool statistics as Triton custom metrics (python backend ``pb_utils.MetricFamily``).

Triton serves them on its metrics port (``/metrics``, default 8002) next to its own ``nv_*`` metrics: gauges
``fastpath_pool_*`` (bytes in use, reserved, capacity, high water, fallback bytes, outstanding and waiting
leases, ``pinned``) and counters ``fastpath_pool_*_total`` (leases, hits, misses, waits, exhausted, fallbacks,
evictions, allocations, frees), labelled ``model``, ``pool``, ``allocator`` and ``pid`` (the stub: see
:mod:`fastpath.triton.metrics`). The exact names: docs/design/memory.md. Inside a model, whatever decides
when (e.g. once per batch) calls :meth:`PoolMetrics.update`::

    self.pool_metrics = PoolMetrics(pb_utils, model=args["model_name"], pools=[host_pool, device_pool])
    self.pool_metrics.update()

Reference: python_backend README, "Custom Metrics" (``MetricFamily.COUNTER`` / ``GAUGE``,
``Metric.increment`` / ``Metric.set``; counters only increase).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Protocol

from fastpath.memory.stats import PoolStats
from fastpath.triton.metrics import stub_labels

GAUGES = {
    "bytes_in_use": "Bytes of pool blocks currently leased",
    "bytes_reserved": "Bytes held from the allocator (free and leased blocks)",
    "capacity_bytes": "Configured pool capacity in bytes",
    "high_water_bytes": "Most bytes ever leased at once",
    "fallback_bytes_in_use": "Bytes leased from pageable fallback memory",
    "outstanding": "Leases not yet released",
    "waiting": "Leases waiting for a block",
    "pinned": "1 when the pool's host memory is page-locked (cudaHostAlloc), else 0",
}
GAUGE_NAMES = {"outstanding": "outstanding_leases", "waiting": "waiting_leases"}
COUNTERS = {
    "leases": "Leases granted",
    "hits": "Leases served from a free list",
    "misses": "Leases that allocated a new block",
    "waits": "Leases that waited because the pool was full",
    "exhausted": "Leases refused with a retryable error after waiting",
    "fallbacks": "Leases served from pageable fallback memory",
    "evictions": "Idle blocks freed to make room for another size class",
    "allocations": "Allocator calls (cudaHostAlloc, cudaMalloc or mmap)",
    "frees": "Blocks returned to the allocator",
}


class StatsSource(Protocol):
    """Anything with ``stats() -> PoolStats`` (a :class:`fastpath.memory.BlockPool`)."""

    def stats(self) -> PoolStats: ...


class PoolMetrics:
    """Triton metric families for a set of pools; :meth:`update` pushes the current statistics.

    Args:
        pb_utils: the ``triton_python_backend_utils`` module.
        model: model name for the ``model`` label.
        pools: pools to export; each pool's ``name`` and allocator become labels.

    Thread-safe: ``update`` may be called from any thread.
    """

    def __init__(self, pb_utils: Any, *, model: str, pools: Iterable[StatsSource]) -> None:
        self._pools = list(pools)
        self._lock = threading.Lock()
        gauge_kind, counter_kind = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        self._gauges = {
            key: pb_utils.MetricFamily(name=f"fastpath_pool_{GAUGE_NAMES.get(key, key)}", description=text, kind=gauge_kind)
            for key, text in GAUGES.items()
        }
        self._counters = {
            key: pb_utils.MetricFamily(name=f"fastpath_pool_{key}_total", description=text, kind=counter_kind)
            for key, text in COUNTERS.items()
        }
        self._metrics: list[tuple[StatsSource, dict[str, Any], dict[str, Any]]] = []
        self._last: list[dict[str, int]] = []
        for pool in self._pools:
            stats = pool.stats()
            labels = {"model": model, "pool": stats.name, "allocator": stats.allocator, **stub_labels()}
            gauges = {key: family.Metric(labels=labels) for key, family in self._gauges.items()}
            counters = {key: family.Metric(labels=labels) for key, family in self._counters.items()}
            self._metrics.append((pool, gauges, counters))
            self._last.append(dict.fromkeys(COUNTERS, 0))
        self._last_gauges: list[dict[str, float]] = [{} for _ in self._pools]
        self.update()

    def close(self) -> None:
        """Drop every metric, then every family, inside ``finalize`` (see ``SchedulerMetrics.close``); idempotent."""
        with self._lock:
            self._metrics = []
            self._last = []
            self._last_gauges = []
            self._gauges = {}
            self._counters = {}

    def update(self) -> None:
        """Set every gauge and advance every counter to the pools' current statistics.

        Only changed values are sent: each ``set``/``increment`` is a stub-to-server round trip,
        and the models call this once per batch (in steady state: the lease and hit counters).
        """
        with self._lock:
            for (pool, gauges, counters), last, shown in zip(self._metrics, self._last, self._last_gauges):
                values = pool.stats().as_dict()
                values["pinned"] = int(bool(values["pinned"]))
                for key, metric in gauges.items():
                    value = float(values[key])
                    if shown.get(key) != value:
                        metric.set(value)
                        shown[key] = value
                for key, metric in counters.items():
                    delta = int(values[key]) - last[key]
                    if delta > 0:
                        metric.increment(float(delta))
                        last[key] = int(values[key])
