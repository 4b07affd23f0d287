"""Where the time goes: wall seconds per phase of the serving path, off unless asked for.

Set ``FASTPATH_PHASE_PROFILE=<directory>`` in tritonserver's environment (the stubs inherit it) and
every python-backend process that serves a FastPath model accumulates, per phase, the seconds spent
and how many times the phase ran, and writes them to ``<directory>/<model instance>.json`` every
10 s and at ``finalize``. ``benchmarks/gpu/triton_gpu.py`` reads those files to print its "where the
time goes" table. Phases use dotted names: ``execute.*`` (Triton's ``execute()`` thread:
decode, tokenize, submit; in return mode plan, run, outputs), ``run.*`` (return mode's batches: stage,
observe), ``scheduler.*`` (plan, stage, run, finish), ``respond`` (building one
``InferenceResponse``), ``graph.*`` (host staging in the graph runner: ``host_stage_direct`` when
the batch went to the device straight from the caller's block, ``host_stage_copy`` when it was
padded into the static buffer first; ``device_and_sync``) and ``gpu.*`` (CUDA event
times of the host-to-device copy, the graph replay and the device-to-host copy) and ``gc.gen0``..``gc.gen2``
(Python's cyclic garbage collector, on whichever thread's allocation triggered it).

``FASTPATH_TIMELINE=<directory>`` keeps each lap as a span too (the last :data:`MAX_SPANS`), written at
``finalize`` to ``<directory>/<model instance>.trace.json``, Chrome trace events in microseconds since the epoch
(Perfetto shows which thread did what when; ``benchmarks/timeline.py`` sums a window per phase). With both
variables unset, :meth:`PhaseProfile.lap` returns at once: the hooks cost nothing measurable.
"""

from __future__ import annotations

import collections
import gc
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

LOG = logging.getLogger(__name__)
ENV = "FASTPATH_PHASE_PROFILE"
TIMELINE_ENV = "FASTPATH_TIMELINE"
DUMP_EVERY_S = 10.0
MAX_SPANS = 300_000  # ~40 MB of spans in a stub; the oldest go first


class PhaseProfile:
    """Accumulated seconds and counts per phase (thread-safe).

    Args:
        directory: where :meth:`dump` writes the sums; None: no sums file.
        timeline: where :meth:`dump` (``force=True``) writes the spans; None: no spans kept. With neither,
            every method is a no-op.
        max_spans: spans kept (the most recent).
        time_collections: also time the garbage collector's collections (phases ``gc.gen0``..``gc.gen2``) while
            enabled, through ``gc.callbacks`` until :meth:`close`.
    """

    def __init__(self, directory: str | Path | None, timeline: str | Path | None = None, max_spans: int = MAX_SPANS,
                 *, time_collections: bool = False) -> None:
        self.enabled = bool(directory) or bool(timeline)
        self.directory = Path(directory) if directory else None
        self.timeline = Path(timeline) if timeline else None
        self._spans: collections.deque[tuple[str, float, float, int, int]] | None = (
            collections.deque(maxlen=max_spans) if timeline else None)
        self._thread_names: dict[int, str] = {}
        self._epoch_offset_s = time.time() - time.perf_counter()
        self._seconds: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._last_dump_s = time.monotonic()
        self._counters: dict[str, Callable[[], float]] = {}
        self._gc_start_s = 0.0
        self._gc: dict[str, list[float]] = {}  # phase -> [seconds, collections], written by _collection alone
        if self.enabled and time_collections:
            gc.callbacks.append(self._collection)

    def close(self) -> None:
        """Stop timing collections (idempotent)."""
        if self._collection in gc.callbacks:
            gc.callbacks.remove(self._collection)

    def _collection(self, phase: str, info: dict) -> None:
        """``gc.callbacks`` hook: a collection's wall time as phase ``gc.gen<generation>``.

        CPython runs it with the GIL held and no collection nests in it, so it takes no lock (a collection
        can start inside :meth:`snapshot`'s locked section, and the lock is not reentrant).
        """
        now = time.perf_counter()
        if phase == "start":
            self._gc_start_s = now
            return
        start, self._gc_start_s = self._gc_start_s, 0.0
        if not start:
            return
        name = f"gc.gen{info.get('generation', 0)}"
        sums = self._gc.setdefault(name, [0.0, 0])
        sums[0] += now - start
        sums[1] += 1
        if self._spans is not None:
            thread = threading.get_ident()
            self._thread_names.setdefault(thread, threading.current_thread().name)
            self._spans.append((name, start, now, thread, 1))

    def lap(self, phase: str, start_s: float, count: int = 1) -> float:
        """Add ``perf_counter() - start_s`` seconds to ``phase``; returns the new ``perf_counter()`` (0.0 when off).

        Args:
            phase: dotted phase name, e.g. ``"execute.tokenize"``.
            start_s: a ``time.perf_counter()`` value (the previous lap's return).
            count: how many units (requests, texts, batches) the phase handled this time.
        """
        if not self.enabled:
            return 0.0
        now = time.perf_counter()
        self.add(phase, now - start_s, count)
        if self._spans is not None:
            thread = threading.get_ident()
            if thread not in self._thread_names:
                self._thread_names[thread] = threading.current_thread().name
            self._spans.append((phase, start_s, now, thread, count))
        return now

    def start(self) -> float:
        """``time.perf_counter()`` when enabled, else 0.0 (a start value for :meth:`lap`)."""
        return time.perf_counter() if self.enabled else 0.0

    def add(self, phase: str, seconds: float, count: int = 1) -> None:
        """Add ``seconds`` (e.g. a CUDA event interval) and ``count`` to ``phase``."""
        if not self.enabled:
            return
        with self._lock:
            self._seconds[phase] = self._seconds.get(phase, 0.0) + seconds
            self._counts[phase] = self._counts.get(phase, 0) + count

    def reset(self) -> None:
        """Forget everything recorded so far (models call it at the end of ``initialize``: warm-up is not serving)."""
        with self._lock:
            self._seconds.clear()
            self._counts.clear()
            self._gc.clear()
            if self._spans is not None:
                self._spans.clear()

    def counter(self, name: str, read: Callable[[], float]) -> None:
        """Report ``read()`` as counter ``name`` in every dump (e.g. allocations since warm-up); no-op when off."""
        if self.enabled:
            self._counters[name] = read

    def counters(self) -> dict[str, float]:
        """Each registered counter's current value (a counter that raises is left out)."""
        values = {}
        for name, read in list(self._counters.items()):
            try:
                values[name] = float(read())
            except Exception:  # a counter must never cost an answer
                continue
        return values

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{phase: {"seconds": total wall seconds, "count": units}}``."""
        collected = {phase: {"seconds": sums[0], "count": int(sums[1])} for phase, sums in list(self._gc.items())}
        with self._lock:
            phases = {phase: {"seconds": self._seconds[phase], "count": self._counts[phase]} for phase in self._seconds}
        return dict(sorted({**phases, **collected}.items()))

    def trace_events(self) -> list[dict]:
        """The kept spans as Chrome trace events: a complete event (``"ph": "X"``; ``ts``, ``dur`` in
        microseconds since the epoch; ``args.count`` the units) per span, and a ``thread_name`` record per thread."""
        if self._spans is None:
            return []
        pid, offset = os.getpid(), self._epoch_offset_s
        spans: list[tuple[str, float, float, int, int]] = []
        for _ in range(3):
            try:
                spans = list(self._spans)
                break
            except RuntimeError:  # a lap on another thread appended meanwhile (deque mutated during iteration)
                continue
        events: list[dict] = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": thread, "args": {"name": name}}
                              for thread, name in list(self._thread_names.items())]
        events += [{"name": phase, "cat": phase.split(".")[0], "ph": "X", "pid": pid, "tid": thread,
                    "ts": round((start + offset) * 1e6, 1), "dur": round((end - start) * 1e6, 1), "args": {"count": count}}
                   for phase, start, end, thread, count in spans]
        return events

    def dump(self, name: str, *, force: bool = True) -> Path | None:
        """Write the snapshot to ``<directory>/<name>.json``; with ``force=False`` at most every 10 s. With
        ``force=True`` also the spans to ``<timeline>/<name>.trace.json`` (encoding them takes a while: at unload).

        Returns the path of the sums written, or None (no sums file, or not yet due). Never raises: a profile must
        not cost an answer (a trace that cannot be written is a warning in the log; the sums file's absence says it).
        """
        if force and self.timeline is not None:
            path = self.timeline / f"{name}.trace.json"
            try:
                self.timeline.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"traceEvents": self.trace_events()}) + "\n")
            except OSError as exc:
                LOG.warning("could not write the timeline to %s (%s=%s): %s", path.resolve(), TIMELINE_ENV, self.timeline, exc)
        if not self.enabled or self.directory is None:
            return None
        now = time.monotonic()
        if not force and now - self._last_dump_s < DUMP_EVERY_S:
            return None
        self._last_dump_s = now
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{name}.json"
            path.write_text(json.dumps({"pid": os.getpid(), "phases": self.snapshot(), "counters": self.counters()}, indent=1) + "\n")
            return path
        except OSError:
            return None


PROFILE = PhaseProfile(os.environ.get(ENV), os.environ.get(TIMELINE_ENV), time_collections=True)
"""The process's profile (one python-backend stub serves one model instance)."""
