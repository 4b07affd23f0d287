"""Bench reports: a JSON file and a PNG (latency vs throughput, and where the time goes).

The PNG needs matplotlib (``pip install 'fastpath[plots]'``); the JSON does not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# what the client saw beyond the server's measured phases: FastPath's answer delivery (building and
# sending the response after the batch ran), the network and the client itself
REST = "delivery + network + client"
PHASE_COLORS = {"queue": "#e15759", "compute_input": "#f28e2b", "compute_infer": "#4e79a7",
                "compute_output": "#76b7b2", "FastPath queue": "#edc948", "FastPath batch run": "#59a14f",
                REST: "#bab0ac"}
FASTPATH_PHASES = {"FastPath queue": "fastpath_queue_us", "FastPath batch run": "fastpath_batch_run_us"}


def _finite(value: Any) -> Any:
    """NaN/inf become None so the JSON is standard (``json.dumps`` would write NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_json(report: dict[str, Any], path: Path) -> Path:
    """Write ``report`` as indented standard JSON (NaN as null)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(report), indent=2, allow_nan=False) + "\n")
    return path


def _value(value: Any) -> float | None:
    """A finite number, or None (NaN, inf, and JSON's null for them)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def has_responses(result: dict[str, Any]) -> bool:
    """Whether a configuration had successful responses in its reported windows (else its latencies
    are undefined: NaN, or null in the JSON)."""
    return _value(result["latency_ms"].get("p50")) is not None


def time_split_ms(result: dict[str, Any]) -> dict[str, float]:
    """Average time per request by phase (ms): Triton's phases (which end when the model's ``execute()``
    returns), FastPath's queue wait and batch run after that (when the bench read FastPath's metrics),
    then what the client saw beyond them (:data:`REST`; 0 where a value is undefined, e.g. no responses)."""
    server = result["server"]
    split = {phase: (_value(server.get(f"{phase}_us")) or 0.0) / 1e3 for phase in
             ("queue", "compute_input", "compute_infer", "compute_output")}
    server_total_ms = (_value(server.get("success_us")) or 0.0) / 1e3
    for phase, key in FASTPATH_PHASES.items():
        split[phase] = (_value(server.get(key)) or 0.0) / 1e3
        server_total_ms += split[phase]
    client_ms = _value(result["latency_ms"].get("avg")) or 0.0
    split[REST] = max(client_ms - server_total_ms, 0.0)
    return split


def _latency_panel(axis: Any, results: list[dict[str, Any]]) -> None:
    shown = [r for r in results if has_responses(r)]
    throughput = [_value(r["throughput_per_s"]) or 0.0 for r in shown]
    for key, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
        axis.plot(throughput, [_value(r["latency_ms"][key]) or 0.0 for r in shown], style, label=key)
    for r, x in zip(shown, throughput):
        axis.annotate(r["label"] + ("" if r["stable"] else " (unstable)"), (x, _value(r["latency_ms"]["p99"]) or 0.0),
                      textcoords="offset points", xytext=(4, 6), fontsize=9)
    empty = [r["label"] for r in results if not has_responses(r)]
    if empty:  # nothing to plot for these: say so on the chart
        axis.text(0.98, 0.02, f"no successful responses: {', '.join(empty)}", transform=axis.transAxes,
                  ha="right", va="bottom", fontsize=9, color="#e15759")
    axis.set_xlabel("throughput (responses/s)")
    axis.set_ylabel("latency (ms)")
    axis.set_title("latency vs throughput")
    axis.grid(alpha=0.3)
    if shown:
        axis.legend(loc="upper left")
    lows = [v for v in (_value(r["latency_ms"]["p50"]) for r in shown) if v]
    highs = [v for v in (_value(r["latency_ms"]["p99"]) for r in shown) if v]
    if lows and highs and max(highs) / max(min(lows), 1e-9) > 20:
        axis.set_yscale("log")  # a sweep from an idle to a saturated server spans decades
        axis.set_ylim(min(lows) / 1.5, max(highs) * 2.0)
    elif highs:
        axis.set_ylim(0, max(highs) * 1.15)
    axis.set_xlim(left=0, right=max(throughput + [1.0]) * 1.2)


def _split_panel(axis: Any, results: list[dict[str, Any]]) -> None:
    labels = [r["label"] + ("" if has_responses(r) else " (no responses)") for r in results]
    left = [0.0] * len(results)
    for phase, color in PHASE_COLORS.items():
        widths = [time_split_ms(r)[phase] for r in results]
        axis.barh(labels, widths, left=left, color=color, label=phase)
        left = [a + b for a, b in zip(left, widths)]
    axis.set_xlabel("average time per request (ms)")
    fastpath = any(_value(r["server"].get(key)) is not None for r in results for key in FASTPATH_PHASES.values())
    axis.set_title("where the time goes (Triton statistics" + (" + FastPath metrics)" if fastpath else ")"))
    axis.invert_yaxis()
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)
    axis.grid(axis="x", alpha=0.3)


def write_png(report: dict[str, Any], path: Path) -> Path:
    """Plot latency (p50/p90/p99) vs throughput per configuration, and the per-phase time split.

    A configuration without successful responses has no point on the latency chart; the chart says
    so, and its bar in the split is labelled "(no responses)".

    Raises:
        ImportError: matplotlib is missing (the message says which extra installs it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("the bench PNG needs matplotlib: pip install 'fastpath[plots]'") from exc
    results = report["results"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    _latency_panel(left, results)
    _split_panel(right, results)
    protocol = {"http": "HTTP", "grpc": "gRPC"}.get(report["protocol"], report["protocol"])
    figure.suptitle(f"fastpath bench: {report['model']} over {protocol} at {report['url']}"
                    f"  ({report['settings']['items_per_request']} item(s)/request, "
                    f"{report['settings']['stable_windows']} x {report['settings']['window_s']:g} s windows)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
