"""How much the raw-ideal yardstick moves on its own: the raw engine's ideal run, back to back.

Run from the repository root with the artifacts built:

    .venv/bin/python scripts/raw_ideal_repeat.py --runs 30

Starts one tritonserver with only ``raw_engine_bench`` (benchmarks/models) loaded and measures the
raw_ideal mode of ``benchmarks/scheduler_cpu.py`` (batches of 64 texts of equal length, ONNX Runtime
fp32, in a stub) ``--runs`` times in a row, printing each run's texts/s and the CPU the machine spent
(benchmarks/cpu_meter.py). On the 2-core dev machine (2026-11-30, fifth session) 30 runs gave
247-331 texts/s, median 308, with no other process busy: the spread every vs-ideal ratio inherits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from scheduler_cpu import RawEngine, build_repository, by_length, ideal_sample, workload_texts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)

    from conftest import start_server

    texts = workload_texts()
    lengths, sorted_texts = by_length(texts)
    values = []
    with tempfile.TemporaryDirectory(prefix="fastpath-ideal-") as tmp:
        server = start_server(Path(tmp), models=("raw_engine_bench",), repository=build_repository(Path(tmp)))
        try:
            raw = RawEngine(server, texts, sum(lengths) / len(lengths))
            raw.measure("raw_ideal", ideal_sample(sorted_texts, 0))  # warm-up
            for index in range(args.runs):
                run = raw.measure("raw_ideal", ideal_sample(sorted_texts, index % 3))
                values.append(run["throughput_per_s"])
                print(f"{index:3d}  {run['throughput_per_s']:6.1f} texts/s  {run['cpu']}", flush=True)
        finally:
            server.stop()
    print(f"min {min(values):.1f}  median {statistics.median(values):.1f}  max {max(values):.1f} texts/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
