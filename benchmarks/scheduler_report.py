"""Summary, goals and the markdown table for benchmarks/scheduler_cpu.py (the scheduler's targets)."""

from __future__ import annotations

import statistics

import numpy as np


def _ms(latencies_s: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(latencies_s) * 1e3, q)), 2) if latencies_s else float("nan")


def _pooled(cells: list[dict]) -> dict:
    """Median throughput over rounds; latency percentiles and padding waste over all rounds pooled."""
    latencies = [value for cell in cells for value in cell["latencies_s"]]
    padded = sum(cell["padded_tokens"] for cell in cells)
    real = sum(cell["real_tokens"] for cell in cells)
    return {
        "throughput_per_s": round(statistics.median(cell["throughput_per_s"] for cell in cells), 2),
        "rounds_throughput_per_s": [round(cell["throughput_per_s"], 2) for cell in cells],
        # the raw_ideal runs beside the cell in each round: before and after each of its slices (in result
        # files of one block per cell: before and after the cell)
        "rounds_ideal_runs_per_s": [[round(v, 1) for v in cell["ideal_runs_per_s"]] for cell in cells if "ideal_runs_per_s" in cell],
        "p50_ms": _ms(latencies, 50),
        "p99_ms": _ms(latencies, 99),
        "padding_waste": round(padded / real, 4) if real else float("nan"),
        # FastPath's engine calls (fastpath_batch_size histogram): texts per call, all rounds
        "texts_per_call": round(sum(cell.get("engine_texts", 0.0) for cell in cells)
                                / sum(cell.get("engine_calls", 0.0) for cell in cells), 2)
        if sum(cell.get("engine_calls", 0.0) for cell in cells) else float("nan"),
        "errors": sum(cell.get("errors", 0) for cell in cells),
        # cores other processes used while this cell ran (benchmarks/cpu_meter.py), worst round
        "other_cores_max": max((cell["cpu"]["other_cores"] for cell in cells if "cpu" in cell), default=float("nan")),
    }


def _vs_ideal(cell: dict, round_: dict, key: str = "ideal_per_s") -> float:
    """A cell's throughput over the raw ideal measured beside it (``key``; benchmarks/scheduler_cpu.py
    ``interleaved_round``: ``ideal_per_s`` is the mean of the runs beside its slices, ``ideal_strict_per_s``
    the mean of the faster of each slice's two; in result files of one block per cell, the faster of the
    runs before and after it), or, for result files without per-cell yardsticks, over the round's raw
    ideal."""
    return cell["throughput_per_s"] / cell.get(key, cell.get("ideal_per_s", round_["raw_ideal"]["throughput_per_s"]))


def _median_ratio(rounds: list[dict], numerator: str, denominator: str) -> float:
    """Median over rounds of numerator / denominator throughput. Against raw_ideal: each cell's own
    yardstick; between two served variants: the ratio of their vs-ideal ratios, so the machine's drift
    between the two cells cancels (both equal the plain throughput ratio when the ideal held still)."""
    if denominator == "raw_ideal":
        return round(statistics.median(_vs_ideal(r[numerator], r) for r in rounds), 3)
    return round(statistics.median(_vs_ideal(r[numerator], r) / _vs_ideal(r[denominator], r) for r in rounds), 3)


def summarize(rounds: dict) -> dict:
    """Raw table, served table and within-round ratios from the per-round cells of a run."""
    raw = {name: _pooled([r[name] for r in rounds["raw"]]) for name in rounds["raw"][0]}
    served: dict = {}
    ratios: dict = {}
    for concurrency, cells in rounds.items():
        if concurrency in ("raw", "mean_tokens"):
            continue
        for variant in cells[0]:
            served.setdefault(variant, {})[concurrency] = _pooled([r[variant] for r in cells])
        ratios[concurrency] = {f"{v}_vs_ideal": _median_ratio(cells, v, "raw_ideal")
                               for v in cells[0] if v not in ("raw_ideal", "echo")}
        if "fastpath" in cells[0] and "ideal_strict_per_s" in cells[0]["fastpath"]:
            ratios[concurrency]["fastpath_vs_ideal_strict"] = round(statistics.median(
                _vs_ideal(r["fastpath"], r, "ideal_strict_per_s") for r in cells), 3)
        for baseline in ("naive", "stack_pad", "fastpath_ref"):  # absent when --variants left the baseline out
            if "fastpath" in cells[0] and baseline in cells[0]:
                ratios[concurrency][f"fastpath_vs_{baseline}"] = _median_ratio(cells, "fastpath", baseline)
        if "echo" in cells[0] and "fastpath" in cells[0]:
            # The latency goal: "within 10% of a single raw engine call plus Triton's own overhead". A single
            # call is raw_call (after the idle gap a served request's engine has); raw_batch_1 (back to back,
            # its engine never idle) gives the _b2b ratio, and stands in for raw_call in files without it.
            for key, raw_name in (("fastpath_p50_vs_raw_call_plus_triton", "raw_call" if "raw_call" in cells[0] else "raw_batch_1"),
                                  ("fastpath_p50_vs_raw_b2b_plus_triton", "raw_batch_1")):
                for variant in ("fastpath", "naive"):
                    if variant not in cells[0]:
                        continue
                    per_round = [_ms(r[variant]["latencies_s"], 50)
                                 / (_ms(r[raw_name]["latencies_s"], 50) + _ms(r["echo"]["latencies_s"], 50)) for r in cells]
                    ratios[concurrency][key.replace("fastpath", variant, 1)] = round(statistics.median(per_round), 3)
            if "naive" in cells[0]:
                ratios[concurrency]["fastpath_p50_vs_naive_p50"] = round(statistics.median(
                    _ms(r["fastpath"]["latencies_s"], 50) / _ms(r["naive"]["latencies_s"], 50) for r in cells), 3)
    return {"raw": raw, "served": served, "ratios": ratios, "rounds": _per_round(rounds),
            "mean_tokens_per_text": round(rounds["mean_tokens"], 2)}


def _per_round(rounds: dict) -> dict:
    """{concurrency: [{fastpath_vs_ideal, other_cores_max}, ...]}: each round's ratio beside the most CPU
    other processes took during any of its cells, so a round that moved can be told from a quiet one."""
    out: dict = {}
    for concurrency, cells in rounds.items():
        if concurrency in ("raw", "mean_tokens") or "fastpath" not in cells[0]:
            continue
        out[concurrency] = [{"fastpath_vs_ideal": round(_vs_ideal(r["fastpath"], r), 3),
                             "slices": r["fastpath"].get("slice_vs_ideal", []),
                             "other_cores_max": max((c["cpu"]["other_cores"] for c in r.values() if "cpu" in c), default=None)}
                            for r in cells]
    return out


def goals(report: dict) -> dict:
    """Each goal of the scheduler with its measured value and whether it is met.

    At concurrency 32: FastPath >= 0.85 x the ideal raw engine, >= 1.6 x naive, >= 2.5 x
    stack-and-pad (within-round ratios, median of rounds), p99 <= 350 ms. At concurrency 1: p50
    within 10 % of one raw engine call (raw batch-1 p50) plus Triton's own overhead (echo p50).
    Padding waste (padded / real tokens) <= 1.15 at every concurrency.
    """
    ratios, served = report["ratios"], report["served"]
    out: dict = {}
    if "32" in ratios:
        for key, name, target in (("fastpath_vs_ideal", "throughput_vs_ideal_c32", 0.85),
                                  ("fastpath_vs_naive", "throughput_vs_naive_c32", 1.6),
                                  ("fastpath_vs_stack_pad", "throughput_vs_stack_pad_c32", 2.5)):
            if key in ratios["32"]:
                out[name] = _goal(ratios["32"][key], ">=", target)
        if "32" in served.get("fastpath", {}):
            out["p99_ms_c32"] = _goal(served["fastpath"]["32"]["p99_ms"], "<=", 350.0)
    if "1" in ratios and "fastpath_p50_vs_raw_call_plus_triton" in ratios["1"]:
        out["p50_c1_vs_raw_call_plus_triton"] = _goal(ratios["1"]["fastpath_p50_vs_raw_call_plus_triton"], "<=", 1.10)
    if served.get("fastpath"):
        out["padding_waste_max"] = _goal(max(cell["padding_waste"] for cell in served["fastpath"].values()), "<=", 1.15)
    return out


def _goal(value: float, op: str, target: float) -> dict:
    met = value >= target if op == ">=" else value <= target
    return {"value": round(value, 3), "target": f"{op} {target}", "met": bool(met)}


def markdown(report: dict) -> str:
    """The results as a markdown document: command, raw table, served table, goals."""
    raw, served, ratios = report["raw"], report["served"], report["ratios"]
    machine, workload = report["machine"], report["workload"]
    lines = [
        "# FastPath scheduler on CPU: served vs raw engine",
        "",
        f"Command: `{report['command']}` (wall time {report['wall_s']:.0f} s).",
        "",
        f"Machine: {machine['cpus']} CPUs ({machine.get('process_cpus', machine['cpus'])} in the benchmark's affinity mask); load average {machine['loadavg_before'][0]:.1f} before, "
        f"{machine['loadavg_after'][0]:.1f} after; benchmark nice value {machine.get('nice', 0)}. {machine['note']}.",
        f"Workload: {workload['source']}, {workload['sentences']} sentences, one text per request, "
        f"{workload.get('load', 'tritonclient gRPC (asyncio)')} closed loop; {workload['rounds']} rounds per concurrency"
        + (f", each a cell of {workload['passes']} slices per variant ({workload['warmup_s']:g} s warm-up + "
           f"{workload['duration_s'] / workload['passes']:g} s measured each), every slice between two raw_ideal runs"
           if "passes" in workload else f", each cell {workload['warmup_s']:g} s warm-up + {workload['duration_s']:g} s measured")
        + ". Throughput is the median over rounds; p50/p99 (by send time) and padding waste pool all rounds; "
        "`vs ideal` is the median over rounds of each cell's throughput over the mean of the raw_ideal runs beside "
        "its slices (`_strict`: over the faster of each slice's two, a stricter yardstick); a ratio between two served variants is the ratio of "
        "their `vs ideal` ratios.",
        "",
        "## Raw engine (tokenize + pad + ONNX Runtime fp32; run inside a python-backend stub, no serving path)",
        "",
        f"Raw throughputs are real tokens/s divided by the corpus mean of {report['mean_tokens_per_text']} tokens per text.",
        "",
        "| variant | texts/s (median) | rounds | padding waste | p50 per call ms |",
        "|---|---:|---|---:|---:|",
    ]
    for name, cell in raw.items():
        lines.append(f"| {name} | {cell['throughput_per_s']:.1f} | {cell['rounds_throughput_per_s']} | "
                     f"{cell['padding_waste']:.3f} | {cell['p50_ms']} |")
    lines += ["", "## Served through Triton 2.51, one text per request", "",
              "| concurrency | variant | texts/s (median) | vs ideal | p50 ms | p99 ms | padding waste | texts per engine call | errors |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for concurrency in ratios:
        for variant, cells in served.items():
            if concurrency not in cells:
                continue
            cell = cells[concurrency]
            ratio = ratios[concurrency].get(f"{variant}_vs_ideal", 1.0 if variant == "raw_ideal" else float("nan"))
            lines.append(f"| {concurrency} | {variant} | {cell['throughput_per_s']:.1f} | {ratio:.2f} | {cell['p50_ms']} | "
                         f"{cell['p99_ms']} | {cell['padding_waste']:.3f} | {cell.get('texts_per_call', float('nan'))} | {cell['errors']} |")
    lines += ["", "Within-round ratios (median over rounds): " + "; ".join(
        f"c={c}: " + ", ".join(f"{k} {v}" for k, v in r.items()) for c, r in ratios.items())]
    if report.get("rounds"):
        lines += ["", "Per round: fastpath / raw_ideal [its slices], and the most CPU other processes (not this "
                      "benchmark, tritonserver or its stubs) took during any cell of the round (benchmarks/cpu_meter.py): "
                  + "; ".join(f"c={c}: " + ", ".join(f"{r['fastpath_vs_ideal']:.2f} {r.get('slices', [])} ({r['other_cores_max']} cores)"
                                                    for r in rs) for c, rs in report["rounds"].items())]
    if "int8_served_cosine" in report:
        cos = report["int8_served_cosine"]
        lines += ["", f"Served INT8 (`fastpath_int8`, model_repository/text_embedding/2) vs served FP32 (`fastpath`) embeddings, "
                      f"{cos['texts']} corpus texts: cosine min {cos['min']}, mean {cos['mean']}."]
    lines += ["", "## Goals", "", "| goal | value | target | met |", "|---|---:|---|---|"]
    for name, goal in report["goals"].items():
        lines.append(f"| {name} | {goal['value']} | {goal['target']} | {'yes' if goal['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"
