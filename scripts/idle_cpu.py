"""CPU a tritonserver uses with no traffic: the background cost of each loaded model's stub.

Run from the repository root with the artifacts built:

    .venv/bin/python scripts/idle_cpu.py                      # every model of benchmarks/scheduler_cpu.py
    .venv/bin/python scripts/idle_cpu.py text_embedding       # a comma-separated list

Starts one tritonserver on the benchmark repository of ``benchmarks/scheduler_cpu.py`` with the
models asked for, waits 3 s after they are ready, then reads the CPU seconds (psutil, user + system)
of tritonserver and every process under it over ``--seconds`` (default 10) and prints cores used in
all and per stub. Processes that start and end within the window (e.g. a watchdog's ``sleep``) are
not counted. Found with it (2026-11-30): 17 idle FastPath models took 0.17 of the dev machine's
2 cores, ~0.011 cores per stub, from the swap agent's 5 ms polling; 0.03 with the inotify watch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from cpu_meter import cpu_seconds  # noqa: E402
from scheduler_cpu import SERVED, build_repository  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="?", default=",".join([*SERVED.values(), "raw_engine_bench"]),
                        help="comma-separated models to load (default: every benchmark model)")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    models = tuple(args.models.split(","))

    from conftest import start_server

    with tempfile.TemporaryDirectory(prefix="fastpath-idle-") as tmp:
        server = start_server(Path(tmp), models=models, repository=build_repository(Path(tmp)))
        try:
            time.sleep(3.0)
            processes = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
            before = {p.pid: cpu_seconds(p) for p in processes}
            time.sleep(args.seconds)
            used = {p.pid: cpu_seconds(p) - before[p.pid] for p in processes if p.is_running()}
            names = {}
            for p in processes:
                try:
                    names[p.pid] = " ".join(p.cmdline()).rsplit(" DEFAULT", 1)[0].rsplit(" ", 1)[-1]
                except psutil.NoSuchProcess:
                    names[p.pid] = "(exited)"
        finally:
            server.stop()
    print(f"{len(models)} models loaded, {len(processes)} processes: {sum(used.values()) / args.seconds:.3f} cores in all while idle")
    for pid, seconds in sorted(used.items(), key=lambda item: -item[1]):
        if seconds > 0:
            print(f"  {seconds / args.seconds:.4f} cores  {names[pid]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
