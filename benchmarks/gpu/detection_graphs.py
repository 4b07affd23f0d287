"""Sweep B of benchmarks/gpu/detection_engine.py: CUDA graph capture and replay of text_detection, one subprocess per variant.

A CUDA fault poisons its process, so each variant runs in ``python detection_graphs.py --variant NAME``: graph-free
maps of every ``capture_shapes_px`` x ``batch_buckets`` shape for two photo batches; the graphs captured as the served
warm-up does (``capture``); ``--replays`` served calls in random shape order, each compared with the graph-free maps
of its photos (float32 algorithm noise ~1e-5; above 1e-3 a replay is wrong) and with the shape's first replay
(``drift``); then replay against graph-free device-resident times. A fault ends the variant, reported with its text
and the replay it happened in. Variants (:data:`B_VARIANTS`): as shipped (a session per captured shape), also with
graph-free calls of other shapes between replays (served traffic); one shared session (a ``gpu_graph_id`` per shape),
which faults on onnxruntime-gpu 1.31.1, alone and with ONNX Runtime's ``arena_extend_strategy`` kSameAsRequested, with
cuDNN's heuristic search on the graph session, and captured largest shape first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from detection_bench import PHOTO_HW, Bench, cuda_missing, gpu_config, load_photos, ms

SHARED = {"session_per_graph": False}  # one graph session, a gpu_graph_id per shape
B_VARIANTS = {  # name: (engine options, capture order, graph-free calls of other shapes between replays)
    "shipped": ({}, "served", False),  # configs/gpu.pbtxt: a session per captured shape
    "shipped_mixed_traffic": ({}, "served", True),
    "shared_session": (SHARED, "served", False),
    "shared_same_as_requested": ({**SHARED, "graph_options": {"arena_extend_strategy": "kSameAsRequested"}}, "served", False),
    "shared_heuristic": ({**SHARED, "graph_options": {"cudnn_conv_algo_search": "HEURISTIC"}}, "served", False),
    "shared_largest_first": (SHARED, "largest_first", False),
}
UNCAPTURED = ((4, 704, 1024), (2, 736, 1920), (1, 1024, 736))  # mixed_traffic's graph-free shapes
WRONG_ABOVE = 1e-3


def graph_variant(name: str, device: str, photos: list, replays: int, seed: int) -> dict:
    """Sweep B, one variant, in this process (a subprocess of the sweep): see the module docstring."""
    from fastpath.memory.cuda import cuda_call, runtime

    options, order, mixed = B_VARIANTS[name]
    config, sched = gpu_config()
    shapes = [(size, h, w) for h, w in config.capture_shapes_hw for size in sched.batch_buckets]
    if order == "largest_first":
        shapes.sort(key=lambda s: -s[0] * s[1] * s[2])
    result: dict = {"variant": name, "options": options, "capture_order": [list(s) for s in shapes], "fault": None}
    try:
        enter(result, "graph-free references")
        bench = Bench(device, photos)
        refs = {s: [bench.served(bench.batch(s, k), keep=True)[1] for k in (0, 1)] for s in shapes}
        free_ms = {s: sorted(bench.resident(s) for _ in range(5))[2] for s in shapes}
        bench.close()
        enter(result, "capture")
        bench = Bench(device, photos, max_graphs=len(shapes), **options)
        started = time.perf_counter()
        bench.engine.capture(shapes)
        result["capture_s"] = round(time.perf_counter() - started, 2)
        enter(result, "replays")
        replay_loop(bench, shapes, refs, replays, np.random.default_rng(seed), mixed, result)
        enter(result, "timing")
        replay_ms = {s: sorted(bench.resident(s) for _ in range(5))[2] for s in shapes}
        result["timing"] = [{"shape": list(s), "replay_ms": ms(replay_ms[s]), "graph_free_ms": ms(free_ms[s]), "replay_images_per_s":
                             round(s[0] / replay_ms[s], 1), "speedup": round(free_ms[s] / replay_ms[s], 2)} for s in shapes]
        result["engine"] = bench.engine.stats().__dict__
        free, total = cuda_call(runtime().cudaMemGetInfo(), "cudaMemGetInfo")
        result["gpu_used_gib"] = round((total - free) / 2**30, 2)
        result["phase"] = "done"
    except BaseException as exc:  # noqa: BLE001 - the fault is the result
        result["fault"] = f"{type(exc).__name__}: {exc}"
        result["traceback_tail"] = traceback.format_exc()[-1500:]
    return result


def enter(result: dict, phase: str) -> None:
    result["phase"] = phase
    print(result["variant"], phase, flush=True)


def replay_loop(bench: Bench, shapes: list, refs: dict, replays: int, rng, mixed: bool, result: dict) -> None:
    """Served calls of random captured shapes and photo batches, each compared with its graph-free maps."""
    worst = {s: 0.0 for s in shapes}
    first: dict = {}
    result.update(replays_done=0, wrong_replays=0, max_drift=0.0)
    for index in range(replays):
        shape, k = shapes[int(rng.integers(len(shapes)))], int(rng.integers(2))
        result["at"] = {"replay": index, "shape": list(shape)}
        maps = bench.served(bench.batch(shape, k), keep=True)[1]
        diff = float(np.abs(maps - refs[shape][k]).max())
        worst[shape] = max(worst[shape], diff)
        result["wrong_replays"] += diff > WRONG_ABOVE
        if (shape, k) in first:
            result["max_drift"] = max(result["max_drift"], float(np.abs(maps - first[shape, k]).max()))
        else:
            first[shape, k] = maps
        if mixed:
            bench.served(bench.batch(UNCAPTURED[index % len(UNCAPTURED)], k))
        result["replays_done"] = index + 1
    result["max_abs_diff"] = max(worst.values())
    result["max_abs_diff_by_shape"] = {"x".join(map(str, s)): round(v, 7) for s, v in worst.items()}


def sweep_b(args: argparse.Namespace, device: str, deadline: float) -> dict:
    """Each variant of ``--graph-variants`` in a subprocess of its own, within the time left."""
    missing = "--device cpu" if args.device == "cpu" else cuda_missing()
    if missing:
        return {"skipped": f"CUDA graphs need the CUDA engine: {missing}"}
    results = {}
    for name in args.graph_variants.split(","):
        left = deadline - time.monotonic()
        if left < 30:
            results[name] = {"skipped": f"time budget spent ({left:.0f} s left)"}
            continue
        out = args.out.with_name(f"{args.out.stem}_{name}.json")
        command = [sys.executable, __file__, "--variant", name, "--device", device, "--out", str(out),
                   "--replays", str(args.replays), "--seed", str(args.seed)] + (["--inputs", str(args.inputs)] if args.inputs else [])
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=min(args.variant_timeout_s, left))
            result = json.loads(out.read_text()) if out.is_file() else {"fault": f"died with rc {proc.returncode} before its report"}
            result.update(rc=proc.returncode, log_tail=(proc.stdout + proc.stderr)[-1500:])
        except subprocess.TimeoutExpired as exc:
            result = json.loads(out.read_text()) if out.is_file() else {"fault": None}
            log = b"".join(part if isinstance(part, bytes) else part.encode() for part in (exc.stdout, exc.stderr) if part)
            result.update(timed_out_s=round(exc.timeout), log_tail=log.decode(errors="replace")[-1500:])
        results[name] = result
        print_b(name, result)
    return results


def print_b(name: str, r: dict) -> None:
    big = next((t for t in r.get("timing", []) if t["shape"] == [16, *PHOTO_HW]), {})
    print(f"sweep B {name}: fault={r.get('fault') or r.get('skipped')} timed_out_s={r.get('timed_out_s')} "
          f"replays={r.get('replays_done')} max_diff={r.get('max_abs_diff')} wrong={r.get('wrong_replays')} "
          f"drift={r.get('max_drift')} capture_s={r.get('capture_s')} 16x736x1312 replay/graph-free ms={big.get('replay_ms')}/"
          f"{big.get('graph_free_ms')} gpu_GiB={r.get('gpu_used_gib')}", flush=True)


def main() -> int:
    """The subprocess of one variant: its JSON to ``--out``, exit 3 after a fault."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", required=True, choices=sorted(B_VARIANTS))
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--inputs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = graph_variant(args.variant, args.device, load_photos(args.inputs)[0], args.replays, args.seed)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.flush()
    os._exit(3 if result["fault"] else 0)  # after a CUDA fault ONNX Runtime's destructors can abort or hang


if __name__ == "__main__":
    sys.exit(main())
