"""The result of a host-side micro-benchmark (benchmarks/tokenizer_cpu.py, benchmarks/detection_decode_cpu.py):
its table printed, ``OUT.json`` (command, machine, settings, rows) and ``OUT.md`` (title, what was compared, the
command, the machine, the table) written, one current result each."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def write_result(out: Path, *, title: str, intro: str, command: str, machine: str, settings: dict, rows: list[dict],
                 table: list[str]) -> None:
    """Print ``table`` (markdown lines) and write ``out`` with the suffixes .json and .md."""
    print("\n".join(table))
    out.with_suffix(".json").write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine, **settings, "rows": rows},
                                                   indent=1) + "\n")
    page = [f"# {title}", "", intro, "",
            f"Command: `{command}`. Machine: {machine}. Data: [{out.name}.json]({out.name}.json).", "", *table, ""]
    out.with_suffix(".md").write_text("\n".join(page))
