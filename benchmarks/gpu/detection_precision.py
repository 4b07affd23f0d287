"""text_detection's GPU engine by precision: float32, TF32 and fp16 candidates, each with and without channels-last.

Runs on the device machine (benchmarks/gpu/detection_precision.sh). Variants: ``fp32`` (``use_tf32`` 0, as shipped),
``tf32`` (``use_tf32`` 1), and ``fp16_<candidate>`` for every ``model.uint8.fp16.<candidate>.onnx`` in ``--models``
(written beforehand by ``python -m fastpath.artifacts.detection_fp16``: the device has no ``onnx``), each
also with the CUDA EP's ``prefer_nhwc`` 1 (``_nhwc``). Each variant is the served engine (configs/gpu.pbtxt's
options: a session per captured shape, whose convolutions search cuDNN's algorithms EXHAUSTIVE, ONNX Runtime's
default), with graphs captured for 16 and 1 images of 736x1312 (a 1280x720 frame under min/736), in turn:
  time     ``--calls`` device-resident replays per shape (``run_resident``: IOBinding buffers, no copies), after the
           16-image buffer holds real photos: median and p90 ms, images/s;
  boxes    against the CPU path (``model.onnx`` on the CPU EP, the reference of benchmarks/gpu/detection_numerics.py),
           same DB post-processing, compared with its ``compare``: the 720_* photos from the 16-image replay, the
           orig_* photos at their own served shapes on the graph-free session (cuDNN HEURISTIC, as served); per
           variant: box counts equal, smallest matched IoU, the map's mean |difference|, and the gate (every count
           equal, smallest IoU >= 0.99).
Time budget: ~8-12 s per variant on an H100/H200 (sessions, EXHAUSTIVE search and capture of two shapes, 40 replays,
23 photos), ~8 s for the CPU reference: ~100 s for 8 variants, under 150 s after set-up; no variant starts past
``--budget-s`` (recorded as skipped). A variant that fails is recorded with its error and the run goes on; the
exit status is 1 when the reference or every variant failed. Without CUDA (or ``--device cpu``) it is a dry run on
the CPU EP: small shapes, two photos, fp32 and the fp16 files (which the CPU EP does not run as a GPU does).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from detection_bench import ROOT, call_times, cuda_missing
from detection_numerics import VERSION_DIR, compare, decode, gpu_config

PHOTO_HW = (736, 1312)
TIMED_BATCHES = (16, 1)
CPU_SHAPES = ((2, 96, 160), (1, 96, 160))  # the dry run's timed (batch, height, width)
GATE_MIN_IOU = 0.99


def variants(models: Path, device: str) -> dict[str, tuple[Path, bool, bool]]:
    """name -> (artifact, TF32, prefer_nhwc), in the order they run (most wanted first)."""
    from fastpath.models.text_detection.config import UINT8_ARTIFACT

    fp32 = VERSION_DIR / UINT8_ARTIFACT
    from fastpath.artifacts.detection_fp16 import CANDIDATE_GLOB, candidate_name

    fp16 = {candidate_name(p): p for p in sorted(models.glob(CANDIDATE_GLOB))}
    if device == "cpu":
        return {"fp32": (fp32, False, False), **{f"fp16_{name}": (path, False, False) for name, path in fp16.items()}}
    table = {"fp32": (fp32, False, False), "fp32_nhwc": (fp32, False, True)}
    for name, path in fp16.items():
        table.update({f"fp16_{name}": (path, False, False), f"fp16_{name}_nhwc": (path, False, True)})
    table.update({"tf32": (fp32, True, False), "tf32_nhwc": (fp32, True, True)})
    return table


def open_engine(device: str, path: Path, tf32: bool, nhwc: bool):
    """The served GPU engine of ``path`` (configs/gpu.pbtxt's options, TF32 and ``prefer_nhwc`` as asked), graphs for
    :data:`TIMED_BATCHES`; on ``cpu`` the CPU EP engine of the file."""
    from fastpath.engines import load_engine

    config = gpu_config()[0]
    if device == "cpu":
        return load_engine("onnxruntime", str(path), **config.cpu_engine_options())
    extra = {"prefer_nhwc": "1"} if nhwc else {}
    options = {**config.gpu_engine_options(), "tf32": tf32, "eager_options": extra, "graph_options": extra}
    return load_engine("onnxruntime", str(path), device=device, layout="images", batch_sizes=TIMED_BATCHES, **options)


def maps_of(engine, device: str, images: np.ndarray) -> np.ndarray:
    """float32 [B, H, W] maps of uint8 [B, H, W, 3] images (a replay when the shape has a graph)."""
    if device == "cpu":
        return engine.infer({engine.inputs[0].name: images})[engine.outputs[0].name][:, 0]
    maps = np.empty(images.shape[:3], np.float32)
    engine.run_into(np.ascontiguousarray(images), maps)
    return maps


def reference(photos: list[Path]):
    """(per photo: decoded as served, resized (PreparedImage), the CPU path's map and detection; the CPU detector,
    whose ``finish`` is the DB post-processing of every variant's maps)."""
    from fastpath.models.text_detection.pipeline import TextDetector

    cpu = TextDetector.from_directory(VERSION_DIR, gpu_config()[0])
    rows = []
    for path in photos:
        prepared = cpu.prepare(decode(path.read_bytes()))
        prob_map = cpu.run_batch([prepared])[0]
        rows.append({"photo": path.name, "prepared": prepared, "map": prob_map, "detection": cpu.finish(prepared, prob_map)})
    return rows, cpu


def judge(refs: list[dict], maps: dict[str, np.ndarray], post) -> dict:
    """Boxes of ``maps`` (photo name -> map) against the CPU path's, per photo and summed up."""
    rows = []
    for ref in refs:
        if ref["photo"] in maps:
            prob_map = maps[ref["photo"]]
            result = compare(ref["detection"], post(ref["prepared"], prob_map))
            rows.append({"photo": ref["photo"], **result, "map_mean_abs_diff": float(np.abs(prob_map - ref["map"]).mean()),
                         "map_max_abs_diff": float(np.abs(prob_map - ref["map"]).max())})
    equal = sum(r["boxes"] == r["other_boxes"] for r in rows)
    min_iou = min((r["min_iou"] for r in rows), default=1.0)
    return {"photos": len(rows), "counts_equal": equal, "min_iou": min_iou,
            "map_mean_abs_diff": float(np.mean([r["map_mean_abs_diff"] for r in rows])) if rows else None,
            "gate": bool(rows) and equal == len(rows) and min_iou >= GATE_MIN_IOU, "per_photo": rows}


def run_variant(device: str, spec: tuple[Path, bool, bool], refs: list[dict], calls: int, post) -> dict:
    """Load, capture, time and judge one variant (module docstring)."""
    path, tf32, nhwc = spec
    start = time.perf_counter()
    engine = open_engine(device, path, tf32, nhwc)
    report: dict = {"artifact": path.name, "tf32": tf32, "prefer_nhwc": nhwc, "load_s": round(time.perf_counter() - start, 2)}
    try:
        framed = [r for r in refs if r["prepared"].shape_hw == PHOTO_HW] or refs[:1]
        maps: dict[str, np.ndarray] = {}
        for shape in (CPU_SHAPES if device == "cpu" else [(b, *PHOTO_HW) for b in TIMED_BATCHES]):
            started = time.perf_counter()
            if device != "cpu":
                engine.capture([shape])
            rows = [framed[i % len(framed)] for i in range(shape[0])]
            if shape[1:] == PHOTO_HW:  # the bound input now holds real photos; the 16-image replay's maps are judged
                for row, prob_map in zip(rows, maps_of(engine, device, np.stack([r["prepared"].resized for r in rows]))):
                    maps.setdefault(row["photo"], prob_map)
            warm = time.perf_counter() - started  # capture (EXHAUSTIVE search included) and the photos' replay
            report[f"b{shape[0]}"] = time_calls(engine, device, shape, calls) | {"warm_s": round(warm, 2)}
        for ref in refs:  # every other photo at its own shape, one image per call
            if ref["photo"] not in maps:
                maps[ref["photo"]] = maps_of(engine, device, ref["prepared"].resized[None])[0]
        report["boxes"] = judge(refs, maps, post)
    finally:
        engine.close()
        del engine
        gc.collect()
    report["total_s"] = round(time.perf_counter() - start, 2)
    return report


def time_calls(engine, device: str, shape: tuple[int, int, int], calls: int) -> dict:
    """Median and p90 of ``calls`` device-resident calls (after two untimed); images/s at the median."""
    feed = np.zeros((shape[0], shape[1], shape[2], 3), np.uint8)
    times = []
    for _ in range(calls + 2):
        started = time.perf_counter()
        _ = engine.run_resident(shape) if device != "cpu" else maps_of(engine, device, feed)
        times.append(time.perf_counter() - started)
    return {"shape": list(shape), "calls": calls, **call_times(shape[0], times[2:])}


def print_table(report: dict) -> None:
    base = report["variants"].get("fp32", {}).get("b16", {}).get("median_ms")
    print("\nvariant | b16 ms | images/s | vs fp32 | b1 ms | counts equal | min IoU | map mean |diff| | gate")
    for name, row in report["variants"].items():
        if "error" in row or "skipped" in row:
            print(f"{name} | {row.get('error') or row.get('skipped')}")
            continue
        b16, b1, boxes = row.get("b16") or row.get(f"b{CPU_SHAPES[0][0]}"), row.get("b1", {}), row["boxes"]
        speed = f"{base / b16['median_ms']:.2f}x" if base and "b16" in row else ""
        print(f"{name} | {b16['median_ms']:.2f} | {b16['images_per_s']:.1f} | {speed} | {b1.get('median_ms', '')} | "
              f"{boxes['counts_equal']}/{boxes['photos']} | {boxes['min_iou']} | {boxes['map_mean_abs_diff']:.2e} | "
              f"{'pass' if boxes['gate'] else 'FAIL'}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (cuda:0 when usable, else a CPU dry run), cpu, cuda[:N]")
    parser.add_argument("--inputs", type=Path, required=True, help="photos of benchmarks/gpu/detection_inputs.py")
    parser.add_argument("--models", type=Path, default=ROOT / ".device" / "precision", help="the fp16 candidates")
    parser.add_argument("--out", type=Path, default=Path("detection_precision.json"))
    parser.add_argument("--calls", type=int, default=20, help="timed calls per shape")
    parser.add_argument("--photos", default="720_*.jpg,720_*.png,orig_*", help="globs in --inputs, judged per variant")
    parser.add_argument("--variants", default="", help="comma-separated subset (default: every variant)")
    parser.add_argument("--budget-s", type=float, default=135.0, help="no variant starts past this many seconds")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    missing = None if args.device == "cpu" else cuda_missing()
    device = "cpu" if args.device == "cpu" or (args.device == "auto" and missing) else ("cuda:0" if args.device == "auto" else args.device)
    photos = sorted({p for pattern in args.photos.split(",") for p in args.inputs.glob(pattern)})
    photos = photos[:2] if device == "cpu" else photos
    import onnxruntime as ort

    table = variants(args.models, device)
    chosen = [v for v in args.variants.split(",") if v] or list(table)
    candidates = args.models / "fp16_candidates.json"
    report: dict = {"command": " ".join(sys.argv), "device": device, "onnxruntime": ort.__version__,
                    "dry_run_because": (missing or "--device cpu") if device == "cpu" else None,
                    "photos": [p.name for p in photos], "gate": f"counts equal, smallest IoU >= {GATE_MIN_IOU}",
                    "candidates": json.loads(candidates.read_text()) if candidates.is_file() else None, "variants": {}}
    if not any(name.startswith("fp16_") for name in table):
        print(f"no fp16 candidates (model.uint8.fp16.*.onnx) in {args.models}: carry it (python -m fastpath.artifacts.detection_fp16)", flush=True)
    started = time.perf_counter()
    refs, cpu = reference(photos)
    report["reference_s"] = round(time.perf_counter() - started, 2)
    for name in chosen:
        if name not in table:
            report["variants"][name] = {"error": f"unknown variant; known: {', '.join(table)}"}
        elif time.monotonic() > deadline:
            report["variants"][name] = {"skipped": f"past --budget-s {args.budget_s:g}"}
        else:
            try:
                report["variants"][name] = run_variant(device, table[name], refs, args.calls, cpu.finish)
            except Exception as exc:  # one variant's failure (a load error, out of memory) leaves the others
                report["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000],
                                            "traceback_tail": traceback.format_exc()[-1500:]}
            print(name, json.dumps({k: v for k, v in report["variants"][name].items() if k != "boxes"})[:400], flush=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    cpu.close()
    print_table(report)
    print(f"\nwrote {args.out}")
    ran = [v for v in report["variants"].values() if "boxes" in v]
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
