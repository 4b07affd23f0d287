"""text_detection's GPU engine alone, in process: time per call by batch, shape and session option (A), CUDA graphs (B).

Runs on the device machine (benchmarks/gpu/detection_engine.sh); without CUDA, or with ``--device cpu``, it is a dry
run: sweep A on the CPU EP at small sizes, sweep B skipped with the reason. Every engine is the served one
(benchmarks/gpu/detection_bench.py: configs/gpu.pbtxt's options, one changed per variant).

Sweep A, the graph-free session, per variant (cuDNN algorithm search HEURISTIC as shipped, DEFAULT, EXHAUSTIVE; TF32;
``cudnn_conv_use_max_workspace`` 0) and shape ((1|2|4|8|16, 736, 1312), the PNG inputs' resized shapes at 1 and 4):
the first call (buffers, algorithm choice or search, arena growth), the median of ``--calls`` device-resident calls
of the same shape (``run_resident``: IOBinding buffers, no copies), and of calls whose shape changes every call, as
in served traffic (ONNX Runtime's Conv keeps one cuDNN plan per node, for the last input shape); for the shipped
variant also with one engine per shape, and the served call (pinned staging, H2D, run, D2H), alone and beside the
served CPU work (PNG decode, DB post-processing) at the default and a 0.5 ms GIL switch interval.
Sweep B: benchmarks/gpu/detection_graphs.py, one subprocess per variant. Writes JSON to ``--out``, prints tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from pathlib import Path

from detection_bench import CPU_SHAPES, PHOTO_HW, Bench, call_times, cuda_missing, decode, gpu_config, load_photos, ms
from detection_graphs import B_VARIANTS, sweep_b

A_VARIANTS = {  # name: (extra CUDA EP options of the graph-free session, TF32)
    "heuristic": ({}, False),  # as shipped
    "heuristic_tf32": ({}, True),
    "default": ({"cudnn_conv_algo_search": "DEFAULT"}, False),
    "exhaustive": ({"cudnn_conv_algo_search": "EXHAUSTIVE"}, False),
    "heuristic_ws0": ({"cudnn_conv_use_max_workspace": "0"}, False),
}
ALTERNATE_CYCLES = 3


def time_shape(bench: Bench, shape: tuple[int, int, int], calls: int, served_too: bool) -> dict:
    """First call of a new shape, then the median of ``calls`` device-resident calls (after two more warm-up calls)."""
    batch = bench.batch(shape)
    first, _ = bench.served(batch)
    row = {"shape": list(shape), "first_ms": ms(first), **call_times(shape[0], [bench.resident(shape) for _ in range(calls + 2)][2:])}
    if served_too:
        row["served_median_ms"] = ms(sorted(bench.served(batch)[0] for _ in range(calls))[calls // 2])
    return row


def alternate(benches: dict) -> dict:
    """Device-resident calls cycling through the shapes of ``benches`` (shape -> Bench, one Bench may serve several), so
    that each call's shape differs from the one before; the median ms per shape."""
    times: dict = {shape: [] for shape in benches}
    for _ in range(ALTERNATE_CYCLES):
        for shape, bench in benches.items():
            times[shape].append(bench.resident(shape))
    return {shape: ms(sorted(t)[len(t) // 2]) for shape, t in times.items()}


def sweep_a(device: str, photos: list, calls: int, variants: list[str]) -> dict:
    shapes = [(size, *PHOTO_HW) for size in gpu_config()[1].batch_buckets]
    for hw in dict.fromkeys(p.shape_hw for p in photos):  # the PNG inputs' resized shapes (720_*.png is PHOTO_HW)
        shapes += [(size, *hw) for size in (1, 4) if hw != PHOTO_HW]
    shapes = list(CPU_SHAPES) if device == "cpu" else shapes
    report = {}
    for name in (["cpu"] if device == "cpu" else variants):
        try:
            report[name] = a_variant(name, device, photos, calls, shapes)
            print_a(name, report[name])
        except Exception as exc:  # one variant's failure (e.g. out of memory) leaves the others
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback_tail": traceback.format_exc()[-1500:]}
            print("sweep A", name, "failed:", report[name]["error"], flush=True)
    return report


def a_variant(name: str, device: str, photos: list, calls: int, shapes: list) -> list[dict]:
    """Every shape on one engine of the variant, then the photo shape's batch sizes in turn (shape-changing calls);
    for the shipped variant the same turns with one engine per shape (each session sees one shape only)."""
    options, tf32 = A_VARIANTS.get(name, ({}, False))
    cycle = [s for s in shapes if s[1:] == shapes[0][1:]]
    bench = Bench(device, photos, **({} if device == "cpu" else {"eager_options": options, "tf32": tf32}))
    rows = [time_shape(bench, shape, calls, served_too=name in ("heuristic", "cpu")) for shape in shapes]
    changing, own = alternate({shape: bench for shape in cycle}), {}
    bench.close()
    if name in ("heuristic", "cpu"):
        engines = {shape: Bench(device, photos) for shape in cycle}
        for shape, other in engines.items():
            time_shape(other, shape, 2, served_too=False)
        own = alternate(engines)
        for other in engines.values():
            other.close()
    for row in rows:
        row.update(shape_changing_ms=changing.get(tuple(row["shape"])), own_engine_changing_ms=own.get(tuple(row["shape"])))
    return rows


def cpu_load(bench: Bench, pngs: list[bytes], threads: tuple[int, int], stop: threading.Event, counts: list[int]) -> list:
    """Start the served CPU work until ``stop``: PNG decode + resize on ``threads[0]`` threads, DB post-processing on
    ``threads[1]``; thread i counts its loops in ``counts[i]`` (decode threads first)."""
    import cv2

    photo = bench.batch((1, *PHOTO_HW))[0]
    pngs = pngs or [cv2.imencode(".png", photo.resized)[1].tobytes()]
    prob_map = bench.served([photo], keep=True)[1][0]
    jobs = [lambda i=i: bench.detector.prepare(decode(pngs[i % len(pngs)])) for i in range(threads[0])]
    jobs += [lambda: bench.detector.finish(photo, prob_map)] * threads[1]

    def loop(index: int) -> None:
        while not stop.is_set():
            jobs[index]()
            counts[index] += 1

    workers = [threading.Thread(target=loop, args=(index,)) for index in range(len(jobs))]
    for worker in workers:
        worker.start()
    return workers


def contention(device: str, photos: list, pngs: list[bytes], seconds: float) -> list[dict]:
    """Served calls quiet, beside the served CPU work, and beside it with a 0.5 ms GIL switch interval."""
    config = gpu_config()[0]
    threads = (2, 1) if device == "cpu" else (config.decode_threads, config.post_threads)
    bench, rows, default = Bench(device, photos), [], sys.getswitchinterval()
    for shape in ([CPU_SHAPES[1]] if device == "cpu" else [(16, *PHOTO_HW), (4, *PHOTO_HW)]):
        batch = bench.batch(shape)
        bench.served(batch)
        for load, interval in (("quiet", default), ("decode+post", default), ("decode+post", 0.0005)):
            stop, counts = threading.Event(), [0] * sum(threads)
            workers = cpu_load(bench, pngs, threads, stop, counts) if load != "quiet" else []
            sys.setswitchinterval(interval)
            times, end = [], time.perf_counter() + seconds
            while time.perf_counter() < end:
                times.append(bench.served(batch)[0])
            stop.set()
            for worker in workers:
                worker.join()
            sys.setswitchinterval(default)
            timed = call_times(shape[0], times)
            rows.append({"shape": list(shape), "load": load, "threads": list(threads) if workers else [0, 0],
                         "switch_interval_ms": ms(interval), "calls": len(times),
                         "median_ms": timed["median_ms"], "p90_ms": timed["p90_ms"],
                         "decodes_per_s": round(sum(counts[: threads[0]]) / seconds, 1),
                         "posts_per_s": round(sum(counts[threads[0]:]) / seconds, 1)})
            print("contention", rows[-1], flush=True)
    bench.close()
    return rows


def print_a(name: str, rows: list[dict]) -> None:
    print(f"\nsweep A {name}: shape | first ms | median ms | p90 ms | images/s | served ms | shape-changing ms | own engine",
          flush=True)
    for r in rows:
        print(f"  {'x'.join(map(str, r['shape'])):>14} | {r['first_ms']:9.1f} | {r['median_ms']:8.2f} | {r['p90_ms']:8.2f} | "
              f"{r['images_per_s']:8.1f} | {r.get('served_median_ms') or '':>8} | {r.get('shape_changing_ms') or '':>8} | "
              f"{r.get('own_engine_changing_ms') or ''}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (cuda:0 when usable, else a CPU dry run), cpu, cuda[:N]")
    parser.add_argument("--inputs", type=Path, help="photos of benchmarks/gpu/detection_inputs.py (without: noise)")
    parser.add_argument("--out", type=Path, default=Path("detection_engine.json"))
    parser.add_argument("--calls", type=int, default=0, help="timed calls per cell (0: 20 on a GPU, 5 on the CPU)")
    parser.add_argument("--variants", default=",".join(A_VARIANTS), help="sweep A variants")
    parser.add_argument("--graph-variants", default=",".join(B_VARIANTS), help="sweep B variants, in this order")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contention-s", type=float, default=2.0, help="seconds of served calls per contention cell")
    parser.add_argument("--budget-s", type=float, default=280.0, help="sweep B starts no variant past this")
    parser.add_argument("--variant-timeout-s", type=float, default=100.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    args.out.parent.mkdir(parents=True, exist_ok=True)
    missing = None if args.device == "cpu" else cuda_missing()
    device = "cpu" if args.device == "cpu" or (args.device == "auto" and missing) else ("cuda:0" if args.device == "auto" else args.device)
    photos, pngs = load_photos(args.inputs)
    import onnxruntime as ort

    report: dict = {"command": " ".join(sys.argv), "device": device, "onnxruntime": ort.__version__,
                    "dry_run_because": (missing or "--device cpu") if device == "cpu" else None,
                    "providers": ort.get_available_providers(), "inputs": len(photos)}
    calls = args.calls or (5 if device == "cpu" else 20)
    stages = {"sweep_a": lambda: sweep_a(device, photos, calls, args.variants.split(",")),
              "contention": lambda: contention(device, photos, pngs, args.contention_s if device != "cpu" else 1.0),
              "sweep_b": lambda: sweep_b(args, device, deadline)}
    for key, stage in stages.items():
        try:
            report[key] = stage()
        except Exception as exc:  # e.g. a CUDA fault, sticky in this process: sweep B still runs, in subprocesses
            report[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback_tail": traceback.format_exc()[-1500:]}
            print(key, "failed:", report[key]["error"], flush=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if "skipped" in report["sweep_b"]:
        print("\nsweep B skipped:", report["sweep_b"]["skipped"])
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
