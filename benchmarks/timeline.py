"""Where a served model's time goes, and what overlapped: a window of FastPath's timeline, summed per phase.

The timeline is what the stubs write at unload when tritonserver runs with ``FASTPATH_TIMELINE=<directory>``
(:mod:`fastpath.profiling`): Chrome trace events, one complete event per span of a phase (``execute.decode``,
``scheduler.stage``, ``scheduler.run``, ``gpu.h2d``, ``gpu.graph``, ``gpu.d2h``, ``post.db``, ...) on the thread
that ran it. For a window of it this prints and returns, per phase: spans, units, busy seconds (summed over
threads), the mean number of threads in it, the share of the window it was active on at least one thread, and its
**overlap with the engine**: the share of the time the engine phase (``scheduler.run`` by default) was running
during which the phase was active too. A decode or post-processing overlap near 1 is the pipeline working: the
next batch decodes and the last one is post-processed while this one is on the device.

    .venv/bin/python benchmarks/timeline.py /tmp/timeline/*.trace.json --from 1764892800.5 --seconds 10 --out t.json

Each model's traces are summed apart (its instances together), with its own engine phase.

Also writes the window's events to ``--cut`` (open it in Perfetto or chrome://tracing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ENGINE_PHASE = "scheduler.run"
ENGINE_PHASES = (ENGINE_PHASE, "execute.run")  # the scheduler's engine calls; a return-mode model's own (text_embedding)
Interval = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Span:
    """One span: its phase, start and end in seconds since the epoch, process, thread and units."""

    phase: str
    start_s: float
    end_s: float
    pid: int
    tid: int
    count: int = 1


def read_events(path: Path) -> list[dict]:
    """The ``traceEvents`` of one Chrome trace file.

    Raises:
        ValueError: the file cannot be read or is not a trace (naming the file and what is wrong).
    """
    try:
        events = json.loads(Path(path).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable Chrome trace with 'traceEvents' ({type(exc).__name__}: {exc})") from None
    if not isinstance(events, list):
        raise ValueError(f"{path}: 'traceEvents' is a {type(events).__name__}, not a list")
    return events


def model_of(path: Path) -> str:
    """The model of a stub's trace file, ``<model>_<group>_<index>.trace.json`` (Triton's instance names)."""
    return re.sub(r"_\d+_\d+$", "", Path(path).name.removesuffix(".trace.json"))


def load_spans(paths: Iterable[Path]) -> list[Span]:
    """The complete events (``"ph": "X"``) of Chrome trace files, as spans sorted by start (ValueError: see
    :func:`read_events`)."""
    spans = []
    for path in paths:
        for event in read_events(path):
            if event.get("ph") == "X":
                start = event["ts"] * 1e-6
                spans.append(Span(event["name"], start, start + event["dur"] * 1e-6, event["pid"], event["tid"],
                                  int(event.get("args", {}).get("count", 1))))
    return sorted(spans, key=lambda span: span.start_s)


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint intervals."""
    union: list[list[float]] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    return [(start, end) for start, end in union]


def length(intervals: Sequence[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def intersection_length(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Total length of the overlap of two sorted, disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def clip(spans: Iterable[Span], start_s: float, end_s: float) -> list[Span]:
    """The spans that overlap [start_s, end_s), cut to it (units kept whole). A span shorter than the traces'
    microsecond resolution has start == end; it counts where it starts inside the window (it did run there)."""
    return [dataclasses.replace(s, start_s=max(s.start_s, start_s), end_s=min(s.end_s, end_s))
            for s in spans if s.start_s < end_s and (s.end_s > start_s or s.start_s >= start_s)]


def summary(spans: Sequence[Span], start_s: float, end_s: float, engine: str = ENGINE_PHASE) -> dict:
    """Per phase of the window [start_s, end_s): spans, units, busy_s, mean_threads, active_share and
    engine_overlap (None for the engine phase itself, or when it never ran)."""
    window = clip(spans, start_s, end_s)
    seconds = end_s - start_s
    unions = {phase: merged((s.start_s, s.end_s) for s in window if s.phase == phase) for phase in {s.phase for s in window}}
    engine_union = unions.get(engine, [])
    engine_s = length(engine_union)
    phases = {}
    for phase in sorted(unions):
        own = [s for s in window if s.phase == phase]
        busy = sum(s.end_s - s.start_s for s in own)
        phases[phase] = {
            "spans": len(own), "units": sum(s.count for s in own), "busy_s": round(busy, 4),
            "mean_threads": round(busy / seconds, 3), "active_share": round(length(unions[phase]) / seconds, 3),
            "threads": len({(s.pid, s.tid) for s in own}),
            "engine_overlap": (None if phase == engine or not engine_s
                               else round(intersection_length(unions[phase], engine_union) / engine_s, 3)),
        }
    return {"window_s": round(seconds, 3), "engine_phase": engine, "engine_busy_share": round(engine_s / seconds, 3),
            "phases": phases}


def engine_phase(spans: Sequence[Span]) -> str:
    """The first of :data:`ENGINE_PHASES` the spans have (the scheduler's, else a return-mode model's)."""
    present = {span.phase for span in spans}
    return next((phase for phase in ENGINE_PHASES if phase in present), ENGINE_PHASE)


def cell_summaries(directory: Path, windows: dict[str, tuple[float, float]], cuts: Path) -> dict:
    """Per served cell ``MODEL:WORKLOAD:C``: :func:`summary` of the model's stubs' traces in ``directory`` over
    the cell's window (seconds since the epoch; all instances together), printed; and the window's first second
    as a Chrome trace, ``<cuts>/timeline_<model>_<workload>_c<C>.trace.json``. A window that begins before the
    stubs' oldest kept span gets an ``error`` instead (``fastpath.profiling.MAX_SPANS``: run the cell last)."""
    results = {}
    for cell, (start, end) in windows.items():
        model, workload, concurrency = cell.split(":")
        traces = [p for p in sorted(directory.glob("*.trace.json")) if model_of(p) == model]
        spans = load_spans(traces)
        if not spans or spans[0].start_s > start:
            results[cell] = {"error": f"the stubs kept no spans from {start:.1f} on (traces: {[p.name for p in traces]})"}
            continue
        results[cell] = {"from_s": start, "instances": len(traces), **summary(spans, start, end, engine_phase(spans))}
        print(cell, "\n" + table(results[cell]), flush=True)
        cut = cuts / f"timeline_{model}_{workload}_c{concurrency}.trace.json"
        cut.write_text(json.dumps({"traceEvents": cut_events(traces, start, start + 1.0)}) + "\n")
    return results


class CellTimelines:
    """The served cells a benchmark keeps FastPath's timeline of (``spec``: ``MODEL:WORKLOAD:C;...``, empty: none).

    :meth:`start` before the server starts (its stubs inherit ``FASTPATH_TIMELINE``), :meth:`ran` after each cell,
    :meth:`summaries` once the server has stopped (the stubs write their traces at unload).
    """

    def __init__(self, spec: str, directory: Path) -> None:
        self.cells = [cell for cell in spec.split(";") if cell]
        self.directory = directory
        self.windows: dict[str, tuple[float, float]] = {}

    def start(self) -> None:
        if self.cells:
            os.environ["FASTPATH_TIMELINE"] = str(self.directory)

    def ran(self, cell: str, started_s: float, ended_s: float) -> None:
        """Cell ``MODEL:WORKLOAD:C`` ran from ``started_s`` to ``ended_s`` (seconds since the epoch); its window is the
        last three quarters, past its warm-up."""
        if cell in self.cells:
            self.windows[cell] = (started_s + 0.25 * (ended_s - started_s), ended_s)

    def summaries(self, cuts: Path) -> dict | None:
        """:func:`cell_summaries` of the cells that ran; None when no cell was asked for."""
        return cell_summaries(self.directory, self.windows, cuts) if self.cells else None


def busiest_window(spans: Sequence[Span], seconds: float, engine: str = ENGINE_PHASE) -> tuple[float, float]:
    """The window of ``seconds`` that ends with the last engine span (the load's last steady stretch), starting no
    earlier than the first engine span; from the first span when no engine phase ran."""
    runs = [s for s in spans if s.phase == engine]
    if not runs:
        return (spans[0].start_s, spans[0].start_s + seconds) if spans else (0.0, seconds)
    last = max(s.end_s for s in runs)
    start = max(runs[0].start_s, last - seconds)
    return start, start + seconds


def table(result: dict) -> str:
    lines = [f"window {result['window_s']} s; engine phase {result['engine_phase']} busy {result['engine_busy_share']:.0%} of it",
             f"{'phase':<22}{'spans':>8}{'units':>8}{'busy s':>9}{'threads':>9}{'mean busy':>11}{'active':>8}{'w/ engine':>11}"]
    for phase, row in result["phases"].items():
        overlap = "" if row["engine_overlap"] is None else f"{row['engine_overlap']:.0%}"
        lines.append(f"{phase:<22}{row['spans']:>8}{row['units']:>8}{row['busy_s']:>9.3f}{row['threads']:>9}"
                     f"{row['mean_threads']:>11.2f}{row['active_share']:>8.0%}{overlap:>11}")
    return "\n".join(lines)


def positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--seconds must be > 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path, nargs="+", help="stub traces; those of several models are summed per model")
    parser.add_argument("--from", dest="start", type=float, help="window start, seconds since the epoch (default: the "
                        "last --seconds of each model's engine work)")
    parser.add_argument("--seconds", type=positive_seconds, default=5.0)
    parser.add_argument("--engine", default=None, help=f"the engine phase (default: the first of {', '.join(ENGINE_PHASES)} present)")
    parser.add_argument("--out", type=Path, help="write the summaries as JSON, one per model")
    parser.add_argument("--cut", type=Path, help="write the window's events as a Chrome trace (the first model's window)")
    args = parser.parse_args(argv)
    models: dict[str, list[Path]] = {}
    for path in args.traces:
        models.setdefault(model_of(path), []).append(path)
    results, first_window = {}, None
    for model, paths in models.items():
        try:
            spans = load_spans(paths)
        except ValueError as exc:
            parser.error(str(exc))
        if not spans:
            print(f"{model}: no spans in {[str(p) for p in paths]}")
            continue
        engine = args.engine or engine_phase(spans)
        start, end = (args.start, args.start + args.seconds) if args.start is not None else busiest_window(spans, args.seconds, engine)
        first_window = first_window or (start, end)
        results[model] = {"traces": [str(p) for p in paths], "from_s": start, **summary(spans, start, end, engine)}
        print(f"{model} ({len(paths)} instance trace(s))\n{table(results[model])}\n")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.cut and first_window:
        args.cut.write_text(json.dumps({"traceEvents": cut_events(args.traces, *first_window)}) + "\n")
    return 0


def cut_events(paths: Iterable[Path], start_s: float, end_s: float) -> list[dict]:
    """The trace events of ``paths`` that overlap [start_s, end_s), with every thread-name record."""
    events = []
    for path in paths:
        for event in read_events(path):
            if event.get("ph") == "M" or (start_s * 1e6 <= event["ts"] + event.get("dur", 0) and event["ts"] <= end_s * 1e6):
                events.append(event)
    return events


if __name__ == "__main__":
    sys.exit(main())
