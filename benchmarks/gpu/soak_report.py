"""The soak's report (benchmarks/gpu/soak.py): the goals from what it recorded (benchmarks/gpu/soak_checks.py), its
JSON, a short table on stdout, the probe's responses as CSV in the work directory and, for a GPU run, a Markdown
page beside the JSON.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import soak_checks as checks
import soak_parts as parts


def _memory_verdict(*verdicts: bool | None) -> bool | None:
    judged = [v for v in verdicts if v is not None]
    return all(judged) if judged else None


def _memory_detail(memory: dict) -> str:
    """How many series were judged, and those over the tolerance with their largest drift."""
    parts = []
    for kind in ("rss", "gpu"):
        if memory[kind].get("unread"):
            parts.append(f"{kind.upper()}: not read ({memory[kind]['unread']})")
            continue
        judged = {name: d for name, d in memory[kind]["drift"].items() if d["within"] is not None}
        over = [f"{name} ({d['max_drift_pct']:.1f} %)" for name, d in judged.items() if not d["within"]]
        parts.append(f"{kind.upper()}: {len(judged)} of {len(memory[kind]['drift'])} series judged, "
                     f"{len(over)} over {checks.MEMORY_TOLERANCE_PCT:g} %" + (f": {', '.join(over)}" if over else ""))
    return "; ".join(parts) + " (each series' largest change after its process's warm-up)"


def goals(result: dict) -> dict:
    """Each goal of the spec: ``met`` (True/False; None when it could not be judged) and what it rests on."""
    outside, probe = result["load"]["outside_kill"], result["probe"]
    failed = outside["failed_triton"] + outside["failed_perf_analyzer"] + probe["failed"]["outside"]
    memory = {kind: checks.memory_verdict(result["memory"][kind]["drift"]) for kind in ("rss", "gpu")}
    consistency = probe["consistency"]
    actions = result["actions"]
    planned = {kind: sum(1 for _, k in result["plan"] if k == kind) for kind in checks.ACTION_KINDS}
    done = {kind: sum(1 for a in actions if a["kind"] == kind and a["ok"]) for kind in checks.ACTION_KINDS}
    broken = [f"{name}: {why}" for name, why in result["parts_failed"].items() if why]
    return {
        "no_failed_requests": {"met": failed == 0, "detail": (
            f"outside the kill segments: {outside['failed_triton']} failed in Triton's statistics, "
            f"{outside['failed_perf_analyzer']} perf_analyzer workers stopped at a failed request, "
            f"{probe['failed']['outside']} probe requests failed; the kill segments lost "
            f"{result['load']['kill_segments']['failed_triton']} (Triton) / {probe['failed']['inside']} (probe), and the "
            "requests inside the killed stub, which nothing answers or counts (perf_analyzer drops them at SIGINT)")},
        "memory_flat": {"met": _memory_verdict(*memory.values()), "detail": _memory_detail(result["memory"])},
        "versions_consistent": {"met": consistency["inconsistent"] == 0 and consistency["answered"] > 0, "detail": (
            f"{consistency['consistent']} of {consistency['answered']} probe responses carried the serving version "
            f"({sum(consistency['in_swap_windows'].values())} inside a swap's call)")},
        "actions_done": {"met": done == planned, "detail": f"done {done} of planned {planned}"},
        "load_ran": {"met": outside["run_error_count"] == 0 and not broken, "detail": (
            f"{outside['run_error_count']} perf_analyzer runs failed outside the kill segments; parts failed: {broken or 'none'}")},
    }


def machine(device: str, load_average: float) -> str:
    """Host name, cores, the load average at the start and, for ``cuda``, the GPU (nvidia-smi's name and driver)."""
    found = f"{platform.node()}, {os.cpu_count()} cores, load average {load_average:.2f} at the start"
    if device == "cuda":
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, check=False, timeout=30)
            found += f", GPU {done.stdout.strip() or done.stderr.strip()[:100]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            found += f", GPU unknown (nvidia-smi: {exc})"
    return found


def build(soak, args, *, interrupted: str | None, serve_exit_code: int | None, machine: str) -> dict:
    """The soak's results as a JSON-ready dict, goals included."""
    actions = [dict(a.__dict__) for a in soak.actions]
    kill_windows = [(a.call_s, a.return_s) for a in soak.actions if a.kind == "kill"]
    responses = soak.probe.responses if soak.probe else []
    sampler, load = soak.sampler, soak.load
    drift = {"warmup_s": args.warmup_s, "process_of": parts.process_of}
    result = {
        "command": "benchmarks/gpu/soak.py " + " ".join(sys.argv[1:]),
        "server": soak.product.described(),
        "machine": machine,
        "device": args.device, "duration_s": args.duration_s, "period_s": args.period_s, "concurrency": args.concurrency,
        "probe_rate_per_s": args.probe_rate_per_s, "sample_every_s": args.sample_every_s, "warmup_s": args.warmup_s,
        "interrupted": interrupted, "serve_exit_code": serve_exit_code, "initial_version": soak.initial_version,
        "plan": soak.plan,
        "actions": [{**a, "call_s": round(a["call_s"], 3), "return_s": round(a["return_s"], 3)} for a in actions],
        "load": checks.load_summary(load.segments if load else [], kill_windows),
        "segments": [dict(s.__dict__) for s in (load.segments if load else [])],
        "probe": {"sent": len(responses), "failed": checks.failures_by_window(responses, kill_windows),
                  "consistency": checks.version_consistency(responses, soak.actions, soak.initial_version or 0)},
        "memory": {"rss": {"unit": "MiB", "samples": sampler.rss if sampler else [],
                           "drift": checks.memory_drift(sampler.rss if sampler else [], **drift)},
                   "gpu": {"unit": "MiB", "unread": sampler.gpu_unread if sampler else "not sampled",
                           "samples": sampler.gpu_memory if sampler else [],
                           "drift": checks.memory_drift(sampler.gpu_memory if sampler else [], **drift)}},
        "request_count_resets": soak.counter.success.resets if soak.counter else 0,
        "parts_failed": {w.name: w.failure for w in soak.workers()},
    }
    result["goals"] = goals(result)
    return result


def table(result: dict) -> list[str]:
    """The short text table: actions, load, probe, memory, goals."""
    lines = [f"soak: {result['duration_s']:g} s on {result['device']}, concurrency {result['concurrency']}, "
             f"serving version {result['initial_version']} at start" + (f"; INTERRUPTED ({result['interrupted']})" if result["interrupted"] else ""),
             f"{'at s':>7} {'action':<7}{'took s':>8} {'version':<9}{'ok':<4}detail"]
    for a in result["actions"]:
        lines.append(f"{a['call_s']:>7.1f} {a['kind']:<7}{a['return_s'] - a['call_s']:>8.2f} "
                     f"{a['version_before']!s:>2} -> {a['version_after']!s:<3}{'yes' if a['ok'] else 'NO':<4}{a['detail'][:120]}")
    for name, part in (("outside kill", result["load"]["outside_kill"]), ("kill segments", result["load"]["kill_segments"])):
        lines.append(f"load {name}: {part['runs']} perf_analyzer runs, {part['succeeded']} answered, {part['failed_triton']} failed "
                     f"(Triton), {part['failed_perf_analyzer']} (perf_analyzer), {part['run_error_count']} runs failed")
    c, failed = result["probe"]["consistency"], result["probe"]["failed"]
    lines.append(f"probe: {result['probe']['sent']} sent, {c['answered']} answered, {c['consistent']} consistent, "
                 f"{c['inconsistent']} inconsistent, in swap calls old/new {c['in_swap_windows']['old']}/{c['in_swap_windows']['new']}; "
                 f"failed {failed['outside']} outside / {failed['inside']} inside the kill window")
    for kind in ("rss", "gpu"):
        memory = result["memory"][kind]
        if memory.get("unread"):
            lines.append(f"{kind} memory: not read ({memory['unread']})")
        for name, d in memory["drift"].items():
            judged = (f"{d['baseline']:.0f} at {d['baseline_s']:.0f} s -> {d['last']:.0f} at {d['last_s']:.0f} s, drift "
                      f"{d['drift_pct']:+.2f} %, max {d['max_drift_pct']:.2f} %" if d["within"] is not None else f"not judged: {d['why']}")
            lines.append(f"{kind} MiB {name:<38} {judged}{'' if d['within'] is None else '  ok' if d['within'] else '  OVER'}")
    lines += [f"goal {name:<20} {'met' if g['met'] else 'not judged' if g['met'] is None else 'NOT MET'}: {g['detail']}"
              for name, g in result["goals"].items()]
    return lines


def markdown(result: dict, json_name: str) -> str:
    """The benchmark page of a GPU run."""
    lines = ["# Soak of `fastpath serve --device cuda`", "",
             f"Command: `{result['command']}` (benchmarks/gpu/soak_gpu.sh). Data: [{json_name}]({json_name}). Server: "
             f"`{result['server']}`. Machine: {result['machine']}.", "",
             "| goal | met | what it rests on |", "|---|---|---|"]
    lines += [f"| {name} | {'yes' if g['met'] else 'not judged' if g['met'] is None else '**no**'} | {g['detail']} |"
              for name, g in result["goals"].items()]
    lines += ["", "```", *table(result), "```", ""]
    return "\n".join(lines)


def write(result: dict, soak, args, workdir: Path) -> None:
    """The JSON to ``args.out`` (and the Markdown page beside it for ``--device cuda``), the probe's responses to
    ``workdir/probe.csv``, the table to stdout."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.device == "cuda":
        args.out.with_suffix(".md").write_text(markdown(result, args.out.name))
    with open(workdir / "probe.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sent_s", "done_s", "version", "error"])
        writer.writerows((f"{r.sent_s:.4f}", f"{r.done_s:.4f}", r.version, r.error or "") for r in (soak.probe.responses if soak.probe else []))
    print("\n".join(table(result)), flush=True)
    print(f"JSON: {args.out}; logs and probe.csv: {workdir}", flush=True)
