"""The result of a host-side micro-benchmark (benchmarks/tokenizer_cpu.py, benchmarks/detection_decode_cpu.py):
its table printed, ``OUT.json`` (command, machine, settings, rows) and ``OUT.md`` (title, what was compared, the
command, the machine, the table) written, one current result each."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


def best_of_rounds(variants: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each variant's least time over ``rounds`` rounds, the variants alternating within a round (so drift on a
    shared machine reaches all of them alike); each callable runs the workload once and returns its time."""
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            best[name] = min(best[name], run())
    return best


def machine_line(library: str) -> str:
    """The machine a result came from: processor, CPUs, Python and ``library`` (e.g. "OpenCV 4.11.0")."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {library}"


def write_result(out: Path, *, title: str, intro: str, command: str, machine: str, settings: dict, rows: list[dict],
                 table: list[str]) -> None:
    """Print ``table`` (markdown lines) and write ``out`` with the suffixes .json and .md."""
    print("\n".join(table))
    out.with_suffix(".json").write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine, **settings, "rows": rows},
                                                   indent=1) + "\n")
    page = [f"# {title}", "", intro, "",
            f"Command: `{command}`. Machine: {machine}. Data: [{out.name}.json]({out.name}.json).", "", *table, ""]
    out.with_suffix(".md").write_text("\n".join(page))
