"""A load generator in the spirit of Triton's perf_analyzer, on :class:`~fastpath_client.AsyncClient`.

Two modes, as perf_analyzer has them:

- **concurrency** (closed loop): ``N`` workers each send a request, wait for its response, send the next;
- **request rate** (open loop): requests start on a schedule (constant gaps, or Poisson), whatever the
  responses do; sends that start more than 1 ms late are counted (``late_sends``).

A run warms up for ``warmup_s``, then measures windows of ``window_s``. After each window it checks
stability like perf_analyzer: the last ``stable_windows`` windows must each lie within
``stability_pct`` percent of their mean, in throughput and in p50 latency. It stops when stable or after
``max_windows``; the report covers the last ``stable_windows`` windows and says whether they were stable.

Server-side times come from Triton's statistics API: snapshots at the window boundaries, and the deltas
over the reported windows of queue, compute_input, compute_infer and compute_output (average per
request, microseconds), plus executions (so the average dynamic batch size). Triton's times stop when
the model's ``execute()`` returns; with a ``fastpath_metrics`` snapshot the split adds what FastPath's
scheduler spent after that (queue wait and batch run, :mod:`fastpath_client.server_metrics`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from fastpath_client.errors import FastPathClientError
from fastpath_client.server_metrics import per_request_us

MakeInputs = Callable[[int], Mapping[str, Any]]
OnProgress = Callable[[float, float, int], None]
Snapshot = Callable[[], Awaitable[Mapping[str, float]]]
SERVER_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadSettings:
    """One load configuration.

    Attributes:
        model: model to load.
        concurrency: closed-loop workers; exactly one of ``concurrency`` and ``request_rate`` is set.
        request_rate: open-loop requests per second.
        poisson: Poisson arrivals in request-rate mode (else constant gaps).
        window_s: length of one measurement window, seconds.
        warmup_s: warm-up before the first window, seconds.
        stable_windows: windows the stability check and the report cover.
        max_windows: measurement windows at most.
        stability_pct: allowed deviation from the mean, percent.
        timeout_s: per-request timeout, seconds (a timed-out request counts as an error).
        items_per_request: items (texts, images) in one request, for items/s.
        seed: random seed for Poisson gaps.

    Raises:
        ValueError: not exactly one mode, concurrency < 1, request_rate <= 0 (or not finite), window_s <= 0,
            warmup_s < 0, timeout_s <= 0, or not 1 <= stable_windows <= max_windows; the message names
            the setting and its value.
    """

    model: str
    concurrency: int | None = None
    request_rate: float | None = None
    poisson: bool = False
    window_s: float = 5.0
    warmup_s: float = 2.0
    stable_windows: int = 3
    max_windows: int = 6
    stability_pct: float = 10.0
    timeout_s: float = 30.0
    items_per_request: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("set exactly one of concurrency and request_rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 (concurrent requests), got {self.concurrency}")
        if self.request_rate is not None and not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise ValueError(f"request_rate must be > 0 requests/s, got {self.request_rate}")
        for name, value, lowest, strict in (("window_s", self.window_s, 0, True), ("warmup_s", self.warmup_s, 0, False),
                                            ("timeout_s", self.timeout_s, 0, True)):
            if not math.isfinite(value) or value < lowest or (strict and value == lowest):
                raise ValueError(f"{name} must be {'>' if strict else '>='} {lowest} s, got {value}")
        if not 1 <= self.stable_windows <= self.max_windows:
            raise ValueError(f"need 1 <= stable_windows <= max_windows, got {self.stable_windows} and {self.max_windows}")

    @property
    def label(self) -> str:
        """``c=8`` or ``r=100/s``."""
        return f"c={self.concurrency}" if self.concurrency is not None else f"r={self.request_rate:g}/s"


@dataclasses.dataclass
class Record:
    """One request: start and end on the load generator's clock (seconds), and its error if any."""

    start_s: float
    end_s: float
    error: str | None = None


def percentiles_ms(latencies_s: np.ndarray) -> dict[str, float]:
    """avg, min, p50, p90, p95, p99 and max of ``latencies_s``, in milliseconds (NaN when empty)."""
    if latencies_s.size == 0:
        return {k: float("nan") for k in ("avg", "min", "p50", "p90", "p95", "p99", "max")}
    ms = latencies_s * 1e3
    p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99])
    return {"avg": float(ms.mean()), "min": float(ms.min()), "p50": float(p50), "p90": float(p90),
            "p95": float(p95), "p99": float(p99), "max": float(ms.max())}


def window_summary(records: list[Record], start_s: float, end_s: float) -> dict[str, float]:
    """Throughput (successful responses/s) and p50 latency of the responses that ended in [start_s, end_s)."""
    ok = np.array([r.end_s - r.start_s for r in records if start_s <= r.end_s < end_s and r.error is None])
    p50 = float(np.percentile(ok, 50) * 1e3) if ok.size else float("nan")
    return {"throughput_per_s": ok.size / max(end_s - start_s, 1e-9), "p50_ms": p50}


def is_stable(windows: list[dict[str, float]], count: int, pct: float) -> bool:
    """perf_analyzer's check: each of the last ``count`` windows within ``pct`` % of their mean, for
    throughput and p50 latency."""
    if len(windows) < count:
        return False
    for key in ("throughput_per_s", "p50_ms"):
        values = np.array([w[key] for w in windows[-count:]])
        mean = values.mean()
        if not np.isfinite(values).all() or mean <= 0 or (np.abs(values - mean) > mean * pct / 100).any():
            return False
    return True


def server_split(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float]:
    """Per-request averages (µs) of Triton's phases between two statistics snapshots, and batch counts;
    with FastPath's seconds in both (key ``"fastpath"``), also ``fastpath_queue_us`` and
    ``fastpath_batch_run_us`` (:func:`~fastpath_client.server_metrics.per_request_us`)."""
    def delta(key: str) -> tuple[int, int]:
        return after[key][0] - before[key][0], after[key][1] - before[key][1]

    split: dict[str, float] = {}
    for phase in SERVER_PHASES + ("success",):
        count, ns = delta(phase)
        split[f"{phase}_us"] = ns / count / 1e3 if count else float("nan")
    inferences, executions = delta("inference_count")[0], delta("execution_count")[0]
    split.update(requests=delta("success")[0], failed=delta("fail")[0], inferences=inferences,
                 executions=executions, avg_batch_size=inferences / executions if executions else float("nan"))
    if "fastpath" in before and "fastpath" in after:
        split.update(per_request_us(before["fastpath"], after["fastpath"], inferences))
    return split


class LoadRun:
    """Drives one :class:`LoadSettings` against a server and summarizes it.

    Args:
        client: an :class:`~fastpath_client.AsyncClient` (use ``retry=NO_RETRY``: errors are counted, not retried).
        settings: the configuration.
        make_inputs: ``make_inputs(i)`` -> the inputs of request ``i`` (name -> array).
        clock: monotonic clock, seconds.
        on_progress: ``on_progress(elapsed_s, planned_s, completed_requests)`` about 4 times a second.
        fastpath_metrics: awaitable snapshot of FastPath's queued-path seconds
            (:func:`fastpath_client.server_metrics.queued_seconds` of a scrape), taken with Triton's
            statistics at each window boundary; None: Triton's split only.
    """

    def __init__(self, client: Any, settings: LoadSettings, make_inputs: MakeInputs, *,
                 clock: Callable[[], float] = time.perf_counter, on_progress: OnProgress | None = None,
                 fastpath_metrics: Snapshot | None = None) -> None:
        self.client, self.settings, self.make_inputs = client, settings, make_inputs
        self._clock, self._on_progress = clock, on_progress
        self._fastpath_metrics = fastpath_metrics
        self.records: list[Record] = []
        self.late_sends = 0
        self._running = True
        self._sent = 0
        self._windows_done = 0

    async def _one(self, index: int) -> None:
        inputs = self.make_inputs(index)
        start = self._clock()
        error = None
        try:
            await self.client.infer(self.settings.model, inputs, timeout_s=self.settings.timeout_s)
        except FastPathClientError as exc:
            error = f"{type(exc).__name__}: {exc}"
        self.records.append(Record(start, self._clock(), error))

    async def _worker(self) -> None:
        while self._running:
            self._sent += 1
            await self._one(self._sent - 1)

    async def _scheduler(self, tasks: set[asyncio.Task]) -> None:
        rng = random.Random(self.settings.seed)
        rate = float(self.settings.request_rate)
        next_s = self._clock()
        while self._running:
            delay = next_s - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -1e-3:
                self.late_sends += 1
            task = asyncio.ensure_future(self._one(self._sent))
            self._sent += 1
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_s += rng.expovariate(rate) if self.settings.poisson else 1.0 / rate

    async def run(self) -> dict[str, Any]:
        """Warm up, measure until stable or ``max_windows``, stop, and return the summary dict."""
        s = self.settings
        start = self._clock()
        in_flight: set[asyncio.Task] = set()
        drivers = ([asyncio.ensure_future(self._worker()) for _ in range(s.concurrency)] if s.concurrency
                   else [asyncio.ensure_future(self._scheduler(in_flight))])
        ticker = asyncio.ensure_future(self._tick(start))
        try:
            boundaries, snapshots, windows = await self._measure(start)
        finally:
            self._running = False
            ticker.cancel()
            await asyncio.wait(drivers + list(in_flight), timeout=s.timeout_s + 1.0)
            for task in drivers + list(in_flight):
                task.cancel()
        return self._summary(boundaries, snapshots, windows)

    async def _measure(self, start: float) -> tuple[list[float], list[dict], list[dict]]:
        s = self.settings
        await asyncio.sleep(max(0.0, start + s.warmup_s - self._clock()))
        boundaries, snapshots, windows = [self._clock()], [await self._snapshot()], []
        while len(windows) < s.max_windows and not is_stable(windows, s.stable_windows, s.stability_pct):
            await asyncio.sleep(max(0.0, boundaries[-1] + s.window_s - self._clock()))
            snapshots.append(await self._snapshot())
            boundaries.append(self._clock())
            windows.append(window_summary(self.records, boundaries[-2], boundaries[-1]))
            self._windows_done = len(windows)
        return boundaries, snapshots, windows

    async def _snapshot(self) -> dict[str, Any]:
        """Triton's statistics of the model and, when asked for, FastPath's queued-path seconds (``"fastpath"``)."""
        snapshot: dict[str, Any] = dict(await self.client.statistics(self.settings.model))
        if self._fastpath_metrics is not None:
            snapshot["fastpath"] = await self._fastpath_metrics()
        return snapshot

    async def _tick(self, start: float) -> None:
        s = self.settings
        while self._on_progress is not None:
            planned = s.warmup_s + s.window_s * max(s.stable_windows, self._windows_done + 1)
            self._on_progress(self._clock() - start, planned, len(self.records))
            await asyncio.sleep(0.25)

    def _summary(self, boundaries: list[float], snapshots: list[dict], windows: list[dict]) -> dict[str, Any]:
        s = self.settings
        first = len(boundaries) - 1 - s.stable_windows
        begin, end = boundaries[first], boundaries[-1]
        chosen = [r for r in self.records if begin <= r.end_s < end]
        ok = np.array([r.end_s - r.start_s for r in chosen if r.error is None])
        errors = [r.error for r in chosen if r.error is not None]
        throughput = ok.size / (end - begin)
        note = None
        if ok.size == 0:  # latencies are then undefined (null in the JSON); the report says why
            note = (f"no successful responses in the reported windows ({len(chosen)} requests ended there, "
                    f"{len(errors)} with errors)")
        return {
            "label": s.label, "concurrency": s.concurrency, "request_rate": s.request_rate, "poisson": s.poisson,
            "measurement_s": end - begin, "windows": windows,
            "stable": is_stable(windows, s.stable_windows, s.stability_pct),
            "requests": len(chosen), "errors": len(errors), "error_samples": sorted(set(errors))[:5],
            "errors_total": sum(r.error is not None for r in self.records), "late_sends": self.late_sends,
            "throughput_per_s": throughput, "items_per_s": throughput * s.items_per_request,
            "latency_ms": percentiles_ms(ok), "server": server_split(snapshots[first], snapshots[-1]),
            "note": note,
        }
