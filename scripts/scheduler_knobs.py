"""Scheduler knobs side by side at one concurrency: texts/s, texts per engine call, padding waste.

Run from the repository root with the artifacts built:

    .venv/bin/python scripts/scheduler_knobs.py \\
        --variant te_gain10 min_padding_gain=1.0 \\
        --variant te_coarse length_buckets_tokens=8,16,24,32,40,48,64,80,96,128,160,192,256 \\
        --rounds 4 --seconds 8

Starts one tritonserver on the benchmark repository of ``benchmarks/scheduler_cpu.py`` with the
shipped ``text_embedding`` and one model per ``--variant NAME KEY=VALUE...`` (the shipped config with
those FastPath parameters set), then drives each model in turn with the benchmark's closed loop of
tritonclient gRPC clients (one pydoc sentence per request, ``--concurrency`` in flight), in
alternating order per round so drifts of the shared machine fall on every variant alike. Per cell it
reads FastPath's own counters before and after (``fastpath_batch_size`` and the token counters), so
texts per call and padding waste (padded / real tokens) are those of the cell alone. Prints one line
per cell and the medians; ``--out`` also writes them as JSON.

Used on 2026-11-30 (sixth session) to check whether bigger batches at c=32 beat the shipped defaults:
they did not beyond the noise (docs/benchmarks/scheduler_cpu_runs.md, "sixth session").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

COUNTERS = ("fastpath_batch_size_count", "fastpath_batch_size_sum", "fastpath_padded_tokens_total", "fastpath_real_tokens_total")


def counters(metrics_url: str, model: str) -> list[float]:
    """FastPath's engine calls, texts, padded and real tokens of ``model`` so far (summed over stubs)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return [sum(float(line.rsplit(" ", 1)[1]) for line in lines
                if line.startswith(name + "{") and f'model="{model}"' in line) for name in COUNTERS]


def parse_variants(specs: list[list[str]]) -> dict[str, dict[str, str]]:
    variants = {}
    for name, *settings in specs:
        pairs = [setting.split("=", 1) for setting in settings]
        if any(len(pair) != 2 for pair in pairs):
            raise SystemExit(f"--variant {name}: settings must be KEY=VALUE, got {settings}")
        variants[name] = dict(pairs)
    return variants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar="NAME KEY=VALUE",
                        help="a model: NAME, then FastPath config.pbtxt parameters to set")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, help="write the cells and medians as JSON here")
    args = parser.parse_args(argv)

    import scheduler_cpu
    from conftest import start_server

    variants = parse_variants(args.variant)
    for name, parameters in variants.items():
        scheduler_cpu.FASTPATH_VARIANTS[name] = (parameters, 1, 0, "1")
    models = ["text_embedding", *variants]
    texts = scheduler_cpu.workload_texts()
    cells: dict[str, list[dict]] = {model: [] for model in models}
    with tempfile.TemporaryDirectory(prefix="fastpath-knobs-") as tmp:
        repository = scheduler_cpu.build_repository(Path(tmp))
        server = start_server(Path(tmp), models=tuple(models), repository=repository)
        metrics_url = f"http://127.0.0.1:{server.options.metrics_port}/metrics"
        try:
            for round_index in range(args.rounds):
                for model in models if round_index % 2 == 0 else models[::-1]:
                    before = counters(metrics_url, model)
                    cell = asyncio.run(scheduler_cpu.load(server.grpc_url, model, texts, args.concurrency, 1.0, args.seconds))
                    time.sleep(0.7)  # FastPath publishes its counters every metrics_interval_ms (500 ms)
                    calls, served, padded, real = (a - b for a, b in zip(counters(metrics_url, model), before))
                    row = {"round": round_index, "texts_per_s": round(cell["throughput_per_s"], 1),
                           "texts_per_call": round(served / max(calls, 1.0), 2), "padding_waste": round(padded / max(real, 1.0), 3)}
                    cells[model].append(row)
                    print(f"round {round_index} {model:24s} {row['texts_per_s']:7.1f} texts/s {row['texts_per_call']:6.2f} texts/call "
                          f"waste {row['padding_waste']:.3f}", flush=True)
        finally:
            server.stop()
    medians = {model: {key: statistics.median(row[key] for row in rows) for key in ("texts_per_s", "texts_per_call", "padding_waste")}
               for model, rows in cells.items()}
    print(f"\nmedians over {args.rounds} rounds, concurrency {args.concurrency}:")
    for model, values in medians.items():
        print(f"  {model:24s} {values['texts_per_s']:7.1f} texts/s {values['texts_per_call']:6.2f} texts/call waste {values['padding_waste']:.3f}")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "variants": variants, "cells": cells, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
