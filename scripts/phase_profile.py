"""Where one model's serving time goes at a given concurrency: FastPath's phase profile under load.

Run from the repository root with the artifacts built:

    .venv/bin/python scripts/phase_profile.py --model text_embedding --concurrency 1 --seconds 8
    .venv/bin/python scripts/phase_profile.py --model text_embedding naive_embedding --passes 4 --seconds 12

Starts one tritonserver on the benchmark repository of ``benchmarks/scheduler_repository.py`` with
``FASTPATH_PHASE_PROFILE`` set (fastpath.profiling: seconds and counts per phase, written by the stub
at unload), loads ``--model`` (several: in ``--passes`` alternating slices each) with a perf_analyzer gRPC closed loop
of one text per request, and
prints throughput, p50 latency and each phase's total seconds, count, and milliseconds per call;
``execute.total``'s count is the number of requests (one per ``execute()`` call at c=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=["text_embedding"],
                        help="models to load; several are measured in alternating slices (--passes)")
    parser.add_argument("--passes", type=int, default=1, help="slices per model, alternating between the models")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fastpath-phases-") as tmp:
        os.environ["FASTPATH_PHASE_PROFILE"] = str(Path(tmp) / "profile")  # inherited by tritonserver's stubs
        from conftest import start_server
        from scheduler_cpu import load, workload_texts
        from scheduler_repository import build_repository

        texts = workload_texts()
        server = start_server(Path(tmp), models=tuple(args.model), repository=build_repository(Path(tmp)))
        cells: dict[str, list[dict]] = {model: [] for model in args.model}
        try:
            for number in range(args.passes):
                for model in (args.model if number % 2 == 0 else args.model[::-1]):
                    cells[model].append(load(server.grpc_url, model, texts, args.concurrency, 1.0, args.seconds / args.passes))
        finally:
            server.stop()  # the stub writes its profile at unload
        for model, parts in cells.items():
            latencies = [value for cell in parts for value in cell["latencies_s"]]
            print(f"{model} at concurrency {args.concurrency}: "
                  f"{statistics.fmean(cell['throughput_per_s'] for cell in parts):.1f} texts/s, "
                  f"p50 {statistics.median(latencies) * 1e3:.2f} ms (slices: "
                  + ", ".join(f"{statistics.median(cell['latencies_s']) * 1e3:.2f}" for cell in parts) + ")")
        for path in sorted((Path(tmp) / "profile").glob("*.json")):
            phases = json.loads(path.read_text())["phases"]
            print(f"{path.stem}: phase, seconds, count, ms per call (totals include each slice's 1 s warm-up)")
            for name, value in sorted(phases.items()):
                print(f"  {name:28s} {value['seconds']:8.3f} {value['count']:7d} {value['seconds'] / max(1, value['count']) * 1e3:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
