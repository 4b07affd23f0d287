"""Export an engine's copy and run counters as Triton custom metrics (python backend ``pb_utils.MetricFamily``).

Counters ``fastpath_engine_<name>_total`` on Triton's metrics port, labelled ``model``, ``device`` and ``pid``
(:func:`~fastpath.triton.metrics.stub_labels`): the bytes the engine copied host to device (batches from the
staging pool), device to host (outputs into it) and device to device (batches decoded on the GPU), the
seconds each kind of copy took, and the engine runs that replayed a CUDA graph, captured one, or ran without
one (a batch is one run, or one per image on per-shape graph-free sessions). A copy's seconds run between
CUDA events on the engine's stream, recorded just before and after it. From page-locked staging blocks the
engine issues the three calls without giving up the GIL (:func:`fastpath.memory.cuda.enqueue_timed_copy`), so
the span is the DMA; from pageable memory it also holds the engine thread's wait for the GIL to issue the copy
(docs/benchmarks/h2d_contention_h100.md). ``rate(fastpath_engine_h2d_bytes_total) /
rate(fastpath_engine_h2d_seconds_total)`` over an interval is the served path's copy bandwidth.

A scheduled model whose engine keeps such counters (text_detection on ONNX Runtime's CUDA EP:
``OnnxRuntimeCudaImageEngine.stats``) exports them through :func:`fastpath.triton.scheduled.engine_metrics`,
published with the other metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fastpath.triton.metrics import stub_labels

COUNTERS = {  # metric name -> (the engine statistics' field, description)
    "h2d_bytes": ("h2d_bytes", "Bytes the engine copied host to device: the inputs of its runs"),
    "h2d_seconds": ("h2d_s", "Seconds of the host-to-device copies, CUDA events from just before each is issued to its end"),
    "d2h_bytes": ("d2h_bytes", "Bytes the engine copied device to host: the outputs of its runs"),
    "d2h_seconds": ("d2h_s", "Seconds of the device-to-host copies, CUDA events from just before each is issued to its end"),
    "d2d_bytes": ("d2d_bytes", "Bytes of images decoded on the GPU copied into the engine's input"),
    "d2d_seconds": ("d2d_s", "Seconds of the device-to-device copies, CUDA events from just before each is issued to its end"),
    "graph_runs": ("graph_runs", "Engine runs that replayed a captured CUDA graph"),
    "capture_runs": ("capture_runs", "Runs that warmed up or captured a CUDA graph"),
    "eager_runs": ("eager_runs", "Engine runs without a CUDA graph (a graph-free batch on per-shape sessions: one run per image)"),
}


class EngineMetrics:
    """Triton counters for one engine; :meth:`update` advances them to ``stats()``.

    Args:
        pb_utils: the ``triton_python_backend_utils`` module.
        model: the ``model`` label; device: the ``device`` label (e.g. ``cuda:0``).
        stats: returns the engine's cumulative statistics, an object with the fields of :data:`COUNTERS`.

    Thread-safe: ``update`` may be called from any thread.
    """

    def __init__(self, pb_utils: Any, *, model: str, device: str, stats: Callable[[], Any]) -> None:
        self._stats = stats
        self._lock = threading.Lock()
        labels = {"model": model, "device": device, **stub_labels()}
        kind = pb_utils.MetricFamily.COUNTER
        self._families = {name: pb_utils.MetricFamily(name=f"fastpath_engine_{name}_total", description=text, kind=kind)
                          for name, (_field, text) in COUNTERS.items()}
        self._metrics = {name: family.Metric(labels=labels) for name, family in self._families.items()}
        self._last = dict.fromkeys(COUNTERS, 0.0)
        self.update()

    def update(self) -> None:
        """Advance each counter by the engine's increase since the last update (only those that grew: each
        ``increment`` is a stub-to-server round trip)."""
        with self._lock:
            if not self._metrics:
                return
            stats = self._stats()
            for name, (field, _text) in COUNTERS.items():
                value = float(getattr(stats, field))
                if value > self._last[name]:
                    self._metrics[name].increment(value - self._last[name])
                    self._last[name] = value

    def close(self) -> None:
        """Drop every metric, then every family, inside ``finalize`` (see ``SchedulerMetrics.close``); idempotent."""
        with self._lock:
            self._metrics = {}
            self._families = {}
