"""Where each served model's time goes: the stubs' phase sums (``FASTPATH_PHASE_PROFILE``), per request, side by side.

Every stub of a FastPath model (and of the benchmark baselines, which use the same profile) writes
``<directory>/<instance>.json`` at unload (:mod:`fastpath.profiling`). This sums a model's instances (Triton names
them ``<model>_<group>_<index>``) and divides each phase's seconds by the requests ``execute()`` handled (the count of
``execute.total``), so models answering the same load compare phase by phase; ``calls`` is how many times a phase ran.

    .venv/bin/python benchmarks/phases.py /tmp/phases --out phases.json

``benchmarks/gpu/served_gpu.sh`` runs it after each run when ``PHASE_PROFILE=1``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REQUESTS_PHASE = "execute.total"  # one count per request (each model's execute() laps it with the call's requests)
_INSTANCE = re.compile(r"^(?P<model>.+)_\d+_\d+$")


def model_of(instance: str) -> str:
    """The model of Triton instance ``instance`` (``text_embedding_gpu_0_3`` -> ``text_embedding_gpu``)."""
    match = _INSTANCE.match(instance)
    return match.group("model") if match else instance


def per_model(directory: Path) -> dict[str, dict[str, dict[str, float]]]:
    """``{model: {phase: {"us_per_request", "calls"}}}`` over the ``*.json`` sums in ``directory``.

    Raises:
        ValueError: a file that is not a phase-profile sum (naming it).
    """
    sums: dict[str, dict[str, list[float]]] = {}
    for path in sorted(Path(directory).glob("*.json")):
        try:
            phases = json.loads(path.read_text())["phases"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a phase-profile sum with 'phases' ({type(exc).__name__}: {exc})") from None
        model = sums.setdefault(model_of(path.stem), {})
        for phase, value in phases.items():
            total = model.setdefault(phase, [0.0, 0])
            total[0] += float(value["seconds"])
            total[1] += int(value["count"])
    table = {}
    for model, phases in sums.items():
        requests = phases.get(REQUESTS_PHASE, [0.0, 0])[1]
        table[model] = {"requests": requests, "phases": {
            phase: {"us_per_request": round(seconds * 1e6 / requests, 1) if requests else None, "calls": calls}
            for phase, (seconds, calls) in sorted(phases.items())}}
    return table


def render(table: dict) -> str:
    """The table as text: a row per phase, a column per model (µs per request, and calls)."""
    models = list(table)
    phases = sorted({phase for entry in table.values() for phase in entry["phases"]})
    lines = [f"{'phase (us per request)':30s}" + "".join(f"{model[:26]:>28s}" for model in models),
             f"{'requests':30s}" + "".join(f"{table[model]['requests']:>28d}" for model in models)]
    for phase in phases:
        cells = []
        for model in models:
            value = table[model]["phases"].get(phase)
            us = value["us_per_request"] if value else None
            cells.append(f"{'-' if us is None else f'{us:.1f}'} ({value['calls'] if value else 0})")
        lines.append(f"{phase:30s}" + "".join(f"{cell:>28s}" for cell in cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="the FASTPATH_PHASE_PROFILE directory of one server's run")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as JSON here")
    args = parser.parse_args()
    try:
        table = per_model(args.directory)
    except ValueError as exc:
        print(f"phases.py: {exc}", file=sys.stderr)
        return 1
    if not table:
        print(f"phases.py: no phase sums in {args.directory} (was FASTPATH_PHASE_PROFILE set for tritonserver?)", file=sys.stderr)
        return 1
    print(render(table))
    if args.out is not None:
        args.out.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
