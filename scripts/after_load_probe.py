"""Does a served load leave CPU work behind that slows the raw-ideal yardstick measured after it?

Run from the repository root with the artifacts built (about 2 minutes, nothing else running):

    .venv/bin/python scripts/after_load_probe.py

In ``benchmarks/scheduler_cpu.py`` runs the raw ideal measured inside the served rounds was slower
than in the raw-only rounds before them (scheduler_cpu_sixth_run1: 325-340 texts/s before, 244-250
at c=32). This script loads the benchmark's models, measures the raw ideal back to back, then after a
c=32 served cell of each ``--variants`` model: for ``--idle-s`` the CPU each thread of the server tree
and of this process takes while nothing is sent (psutil, per 0.5 s window), then the raw ideal again.

Result on the dev machine (2026-11-30, seventh session): nothing is left behind. After a c=32 cell of
FastPath or naive no thread of the server tree used 1% of a core beyond the first 0.5 s (the
benchmark itself ~0.02 cores: this script's sampling), and the raw ideal measured 209 texts/s
(median of 6) before any load, 244 after FastPath's cell and 231 after naive's, each set spanning
181-303: the machine's own drift, which ``benchmarks/scheduler_cpu.py`` now interleaves against.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from scheduler_cpu import SERVED, RawEngine, build_repository, by_length, ideal_sample, load, workload_texts  # noqa: E402


def thread_times() -> dict[tuple[int, int], tuple[str, float]]:
    """{(pid, tid): (process/thread name, CPU s)} for this process and its descendants."""
    out: dict[tuple[int, int], tuple[str, float]] = {}
    root = psutil.Process()
    for process in [root, *root.children(recursive=True)]:
        try:
            cmd = process.cmdline()
            label = "bench" if process.pid == root.pid else Path(cmd[0]).name
            if "triton_python_backend_stub" in label and len(cmd) > 1:
                label = "stub:" + Path(cmd[1]).parent.parent.name
            for thread in process.threads():
                try:
                    comm = Path(f"/proc/{process.pid}/task/{thread.id}/comm").read_text().strip()
                except OSError:
                    comm = "?"
                out[(process.pid, thread.id)] = (f"{label}/{comm}", thread.user_time + thread.system_time)
        except psutil.Error:
            continue
    return out


def idle_windows(seconds: float, window_s: float = 0.5) -> list[dict[str, float]]:
    """Per window: {name: cores} of the threads that used >= 1% of a core."""
    windows = []
    before, t0 = thread_times(), time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        time.sleep(window_s)
        after, t1 = thread_times(), time.perf_counter()
        usage: dict[str, float] = {}
        for key, (name, cpu) in after.items():
            used = cpu - before.get(key, (name, 0.0))[1]
            if used > 0:
                usage[name] = usage.get(name, 0.0) + used / (t1 - t0)
        windows.append({name: round(cores, 3) for name, cores in sorted(usage.items(), key=lambda kv: -kv[1])
                        if cores >= 0.01})
        before, t0 = after, t1
    return windows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["fastpath", "naive"])
    parser.add_argument("--ideal-runs", type=int, default=6)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--load-s", type=float, default=5.0)
    args = parser.parse_args(argv)

    from conftest import start_server

    texts = workload_texts()
    lengths, sorted_texts = by_length(texts)
    models = tuple(dict.fromkeys([SERVED[v] for v in args.variants] + ["raw_engine_bench"]))

    def ideals(raw: RawEngine, label: str) -> None:
        values = []
        for index in range(args.ideal_runs):
            time.sleep(0.5)
            values.append(raw.measure("raw_ideal", ideal_sample(sorted_texts, index % 3))["throughput_per_s"])
        print(f"{label:28s} raw_ideal " + " ".join(f"{v:5.0f}" for v in values)
              + f"   median {statistics.median(values):.0f}", flush=True)

    with tempfile.TemporaryDirectory(prefix="fastpath-probe-") as tmp:
        server = start_server(Path(tmp), models=models, repository=build_repository(Path(tmp)))
        try:
            raw = RawEngine(server, texts, sum(lengths) / len(lengths))
            raw.measure("raw_ideal", ideal_sample(sorted_texts, 0))  # warm-up
            ideals(raw, "before any load")
            print("idle, before any load:", idle_windows(args.idle_s), flush=True)
            for variant in args.variants:
                cell = asyncio.run(load(server.grpc_url, SERVED[variant], texts, 32, 1.0, args.load_s))
                print(f"{variant} c=32: {cell['throughput_per_s']:.0f} texts/s", flush=True)
                for index, window in enumerate(idle_windows(args.idle_s)):
                    print(f"  idle window {index}: {window}", flush=True)
                ideals(raw, f"after {variant}")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
