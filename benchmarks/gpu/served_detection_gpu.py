"""text_detection on one GPU: numerics, the raw in-process pipeline, and Triton 2.51 serving under perf_analyzer.

Runs on the device machine (docs/benchmarks/detection_gpu_h200.md has the commands), with the stub's
environment from ``scripts/gpu_setup.sh`` (numpy 1.26, onnxruntime-gpu, OpenCV 4.11, pyclipper) and
real photos from ``benchmarks/gpu/detection_inputs.py`` (``--inputs``). Steps, in one process:

  1. numerics in-process, every photo: the CPU path (``model.onnx``, CPU EP, exact shapes) against the
     GPU path (``model.uint8.onnx``, CUDA EP) at the exact shape in float32 and in TF32, and padded to a
     shape bucket of ``PAD_SIDES_PX`` (the opt-in ``bucket_sides_px``): box counts, matched IoU, and the
     padding's extra pixels;
  2. the raw in-process pipeline on the 1280x720 JPEGs: decode + resize on ``decode_threads`` threads,
     batches of ``B`` staged into the page-locked pool, the engine (H2D, graph replay, D2H), DB
     post-processing on threads; images/s. Also the device-resident ceiling (graph replays alone);
  3. serving: a private model repository with ``text_detection`` (its ``configs/gpu.pbtxt``) and
     ``naive_detection`` (benchmarks/models: one request per ``execute()``, pageable copies, CUDA EP), and
     the variants the cells name (``VARIANTS`` of detection_variants.py, e.g. ``text_detection_graph_free``: no CUDA graphs, every shape on one
     session), perf_analyzer (gRPC) per workload and concurrency; CPU of each process group, GPU memory, the
     engine's copy counters from the server log.

Writes JSON to ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_analyzer as pa  # noqa: E402  (benchmarks/perf_analyzer.py: input data, cells)
import stub_probes  # noqa: E402  (CPU accounting, metrics, py-spy, GPU memory)
import thread_cpu  # noqa: E402  (CPU per stub thread)
import timeline  # noqa: E402  (benchmarks/timeline.py: FastPath's timeline per cell)
from detection_numerics import VERSION_DIR, decode, gpu_config, numerics  # noqa: E402  (step 1)
from detection_variants import build_repository, named_models, named_variants  # noqa: E402

from fastpath.artifacts.detection_fp16 import CANDIDATE_GLOB  # noqa: E402


def raw_pipeline(jpegs: list[bytes], device: str, batch: int, seconds: float = 6.0, tf32: bool = False) -> dict:
    """Step 2: decode + resize (threads) -> stage -> engine -> DB post (threads), batches of ``batch``; images/s.

    Two workers stage and run batches, so staging batch N+1 overlaps the engine running batch N; DB
    post-processing runs on ``post_threads`` threads. Also, one image at a time: each stage's time
    (the single-image latency of the pipeline), and the device-resident ceiling (graph replays alone).
    """
    import dataclasses
    import itertools
    import threading

    from fastpath.memory import PoolConfig, create_host_pool
    from fastpath.models.text_detection.device_batches import DeviceBatchHandler
    from fastpath.models.text_detection.pipeline import TextDetector

    config, sched = gpu_config()
    config = dataclasses.replace(config, cuda_tf32=tf32)
    detector = TextDetector.from_directory(VERSION_DIR, config, device=device, batch_sizes=sched.batch_buckets)
    pool = create_host_pool(PoolConfig(capacity_bytes=1 << 30, max_block_bytes=1 << 29), name="raw", device=device)
    handler = DeviceBatchHandler(detector, pool)
    # the graphs the served model captures at load (configs/gpu.pbtxt's capture_shapes_px at every batch bucket)
    detector.engine.capture([(size, height, width) for height, width in config.capture_shapes_hw for size in sched.batch_buckets])
    decoders = ThreadPoolExecutor(config.decode_threads or 8)
    posts = ThreadPoolExecutor(config.post_threads or 6)
    counter = itertools.count()
    feed_lock = threading.Lock()

    def prepare(data: bytes):
        return detector.prepare(decode(data))

    def post(item, prob):
        detector.finish(item, prob[: item.shape_hw[0], : item.shape_hw[1]])

    def worker(stop_s: float, ahead: list) -> int:
        done = 0
        while time.perf_counter() < stop_s:
            with feed_lock:
                futures = [ahead.pop(0) for _ in range(batch)]
                ahead.extend(decoders.submit(prepare, jpegs[next(counter) % len(jpegs)]) for _ in range(batch))
            group = [future.result() for future in futures]
            maps = handler.run(handler.stage_images(group, batch, group[0].shape_hw))
            [f.result() for f in [posts.submit(post, item, prob) for item, prob in zip(group, maps.maps)]]
            maps.lease.release()
            done += len(group)
        return done

    def run(limit_s: float) -> tuple[int, float]:
        ahead = [decoders.submit(prepare, jpegs[next(counter) % len(jpegs)]) for _ in range(4 * batch)]
        started = time.perf_counter()
        with ThreadPoolExecutor(2) as workers:
            done = sum(workers.map(worker, [started + limit_s] * 2, [ahead, ahead]))
        elapsed = time.perf_counter() - started
        for future in ahead:
            future.result()
        return done, elapsed

    run(1.5)  # warm-up and capture
    done, elapsed = run(seconds)
    stats = detector.engine.stats()
    stages = single_image_stages(detector, handler, jpegs)
    idle = idle_copy_rates(detector, handler, [detector.prepare(decode(jpegs[k % len(jpegs)])) for k in range(batch)])
    shape = (batch, *detector.prepare(decode(jpegs[0])).shape_hw)
    ceiling = device_resident(detector, shape)
    decoders.shutdown()
    posts.shutdown()
    detector.close()
    pool.close()
    return {"batch": batch, "tf32": tf32, "images_per_s": round(done / elapsed, 1), "images": done, "seconds": round(elapsed, 2),
            "device_resident_graph_images_per_s": ceiling, "bucket": list(shape), "single_image_ms": stages,
            "h2d_GBps": round(stats.h2d_bytes / max(stats.h2d_s, 1e-9) / 1e9, 2),
            "d2h_GBps": round(stats.d2h_bytes / max(stats.d2h_s, 1e-9) / 1e9, 2), "idle_copies_GBps": idle, "engine": stats.__dict__}


def idle_copy_rates(detector, handler, group: list, rounds: int = 10) -> dict:
    """GB/s of the served path's own H2D (from its pinned staging block) and D2H copies, one engine call at a time on
    an otherwise idle engine (the engine's event-timed counters before and after each call): best and median.

    Set beside ``pinned_h2d_GBps`` (best of ten bare 64 MB copies), it tells a slower pool or engine copy from copies
    slowed by the load around them (the pipeline's ``h2d_GBps`` is the mean under load).
    """
    rates: dict[str, list[float]] = {"h2d": [], "d2h": []}
    same = [item for item in group if item.shape_hw == group[0].shape_hw]
    for _ in range(rounds):
        before = detector.engine.stats()
        maps = handler.run(handler.stage_images(same, len(same), same[0].shape_hw))
        maps.lease.release()
        after = detector.engine.stats()
        for kind in rates:
            nbytes = getattr(after, f"{kind}_bytes") - getattr(before, f"{kind}_bytes")
            seconds = getattr(after, f"{kind}_s") - getattr(before, f"{kind}_s")
            rates[kind].append(nbytes / max(seconds, 1e-9) / 1e9)
    return {f"{kind}_{name}": round(float(fn(values)), 2) for kind, values in rates.items()
            for name, fn in (("best", max), ("median", np.median))}


def single_image_stages(detector, handler, jpegs: list[bytes], rounds: int = 40) -> dict:
    """Median milliseconds of each stage for one image at a time (decode, resize, stage, engine, post) and in all."""
    times: dict[str, list[float]] = {name: [] for name in ("decode", "resize", "stage", "engine", "post", "total")}
    for k in range(rounds):
        t0 = time.perf_counter()
        image = decode(jpegs[k % len(jpegs)])
        t1 = time.perf_counter()
        item = detector.prepare(image)
        t2 = time.perf_counter()
        staged = handler.stage_images([item], 1, item.shape_hw)
        t3 = time.perf_counter()
        maps = handler.run(staged)
        t4 = time.perf_counter()
        detector.finish(item, maps.maps[0])
        maps.lease.release()
        t5 = time.perf_counter()
        for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
            times[name].append(seconds)
    return {name: round(float(np.median(values[rounds // 4:])) * 1e3, 3) for name, values in times.items()}


def device_resident(detector, shape: tuple[int, int, int]) -> float | None:
    """Images/s of graph replays of ``shape`` alone, input and output already on the device (``run_resident``: on the
    engine's own thread, whose graphs ONNX Runtime replays; from another thread it would capture graphs of its own)."""
    if shape not in detector.engine.graph_shapes:
        return None
    for _ in range(3):
        detector.engine.run_resident(shape)
    started, runs = time.perf_counter(), 30
    for _ in range(runs):
        detector.engine.run_resident(shape)
    return round(runs * shape[0] / (time.perf_counter() - started), 1)


def pinned_h2d_GBps(device: str, nbytes: int = 64 << 20) -> float:
    """Raw pinned host-to-device copy rate (cudaMemcpyAsync from cudaHostAlloc memory, events), for the ratio."""
    from fastpath.memory.cuda import cuda_call, runtime

    cudart = runtime()
    cuda_call(cudart.cudaSetDevice(int(device.partition(":")[2] or 0)))
    host = cuda_call(cudart.cudaHostAlloc(nbytes, 0))
    dev = cuda_call(cudart.cudaMalloc(nbytes))
    stream = cuda_call(cudart.cudaStreamCreate())
    start, end = cuda_call(cudart.cudaEventCreate()), cuda_call(cudart.cudaEventCreate())
    best = 0.0
    for _ in range(10):
        cuda_call(cudart.cudaEventRecord(start, stream))
        cuda_call(cudart.cudaMemcpyAsync(dev, host, nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream))
        cuda_call(cudart.cudaEventRecord(end, stream))
        cuda_call(cudart.cudaEventSynchronize(end))
        best = max(best, nbytes / (cuda_call(cudart.cudaEventElapsedTime(start, end)) * 1e-3) / 1e9)
    cudart.cudaFreeHost(host)
    cudart.cudaFree(dev)
    return round(best, 2)


def input_files(root: Path, inputs: Path) -> dict[str, Path]:
    """perf_analyzer --input-data JSON per workload: one image per request, each entry another photo."""
    files = {}
    for workload, pattern in (("jpeg720", "720_*.jpg"), ("png720", "720_*.png"), ("jpegmixed", "mixed_*.jpg")):
        photos = [p.read_bytes() for p in sorted(inputs.glob(pattern))]
        if photos:
            files[workload] = pa.write_input_data(root / f"{workload}.json", pa.image_entries(photos))
    raw = [np.ascontiguousarray(decode(path.read_bytes()))[None] for path in sorted(inputs.glob("720_*.jpg"))[:8]]
    files["raw720"] = pa.write_input_data(root / "raw720.json", pa.array_entries(raw, "IMAGE"))
    return files


def serve(args, files: dict[str, Path], root: Path) -> dict:
    from fastpath.server.process import ServerOptions, TritonServer
    from tests.conftest import free_ports

    analyzer = pa.find()  # PERF_ANALYZER and FASTPATH_PA_LIBS on the GPU machine (detection_gpu.sh)
    variants = named_variants(args.cells, args.py_spy_cells)
    repository = build_repository(root, variants, args.fp16_models)
    http_port, grpc_port, metrics_port = free_ports(3)
    named = named_models(args.cells, args.py_spy_cells)
    models = tuple(m for m in ("text_detection", *variants, "naive_detection") if m in named)  # the GPU holds these only
    server = TritonServer(ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                        host="127.0.0.1", exit_timeout_s=60, models=models), log_path=root / "tritonserver.log")
    report: dict = {"rows": []}
    timelines = timeline.CellTimelines(args.timeline_cells, root / "timeline")
    timelines.start()
    started = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout_s=400)
        report["load_s"] = round(time.monotonic() - started, 1)
        report["gpu_memory_mib_after_load"] = stub_probes.gpu_memory_mib()[0]
        print("ready in", report["load_s"], "s; GPU memory", report["gpu_memory_mib_after_load"], flush=True)
        for spec in args.cells.split(";"):
            model, workload, levels = spec.split(":")
            for concurrency in (int(c) for c in levels.split(",")):
                account = stub_probes.CpuAccount(server.pid)
                threads = thread_cpu.ThreadCpu([pid for pid, name in account.stubs.items() if name == model])
                before = stub_probes.model_metrics(metrics_port, model, "fastpath_")
                dumps: list = []
                spy = None
                if f"{model}:{workload}:{concurrency}" in args.py_spy_cells.split(";"):
                    import threading

                    spy = threading.Thread(target=stub_probes.py_spy_dumps, args=(model, dumps), daemon=True)
                    spy.start()
                t0, wall_t0 = time.monotonic(), time.time()
                try:
                    load = pa.Load(model=model, url=server.grpc_url, data=files[workload], concurrency=concurrency)
                    cell = pa.stable_cell(analyzer, load, measurement_ms=args.measurement_ms,
                                          csv_path=root / f"{model}_{workload}_c{concurrency}.csv")
                except (pa.PerfAnalyzerError, subprocess.TimeoutExpired) as exc:
                    report.setdefault("failed_cells", []).append({"cell": spec, "concurrency": concurrency, "error": str(exc)[-600:]})
                    print("FAILED", spec, concurrency, str(exc)[-600:], flush=True)
                    report["failed_cells"][-1].update(stub_probes.failure_state(metrics_port, model, root / "tritonserver.log"))
                    print("    server then:", report["failed_cells"][-1], flush=True)
                    continue
                wall_s = time.monotonic() - t0
                timelines.ran(f"{model}:{workload}:{concurrency}", wall_t0, wall_t0 + wall_s)
                cell["fastpath_metrics"] = stub_probes.metric_deltas(before, stub_probes.model_metrics(metrics_port, model, "fastpath_"))
                if spy is not None:
                    spy.join(timeout=60)
                    report.setdefault("py_spy_dumps", {})[f"{model}:{workload}:{concurrency}"] = dumps
                cell["cpu"] = account.finish(max(1, int(cell["req_per_s"] * wall_s)), 0.0, wall_s)
                cell["stub_threads"] = threads.finish(wall_s, stub_probes.py_spy_binary())
                cell.pop("texts_per_s", None)
                cell.update(model=model, workload=workload, concurrency=concurrency)
                report["rows"].append(cell)
                images = max(1.0, cell["req_per_s"] * wall_s)
                print(line(cell), "\n    stub cores per thread group:", cell["stub_threads"]["groups"],
                      "\n    stub minor faults per image:", {k: round(v / images) for k, v in cell["stub_threads"]["faults"].items()
                                                           if v >= images}, flush=True)
                args.out.write_text(json.dumps({**args.report, "served": report}, indent=2) + "\n")  # so far, kept if cut short
        report["gpu_memory_mib_end"] = stub_probes.gpu_memory_mib()[0]
    finally:
        server.stop()
        log = (root / "tritonserver.log").read_text()
        report["engine_stats_in_log"] = re.findall(r"text_detection engine on .*", log)
        report["stub_crashes_in_log"] = sum(log.count(m) for m in ("Segmentation fault", "Fatal Python error"))
        report["errors_in_log"] = log.count(" E1") + log.count("Traceback")
        report["log_tail"] = log[-3000:]
        if timelines.cells:
            report["timelines"] = timelines.summaries(args.out.parent)
    return report


def line(r: dict) -> str:
    cpu = r["cpu"]["cpu_us_per_request"]
    stub = cpu.get(f"stubs:{r['model']}", sum(v for k, v in cpu.items() if k.startswith("stubs:")))
    m = r.get("fastpath_metrics", {})
    batch = m.get("fastpath_batch_size_sum", 0) / max(1, m.get("fastpath_batch_size_count", 0))
    copy_s = m.get("fastpath_engine_h2d_seconds_total", 0)  # the engines' own copies from the staging pool (CUDA events)
    h2d = f"  h2d {m.get('fastpath_engine_h2d_bytes_total', 0) / copy_s / 1e9:5.1f} GB/s" if copy_s > 0 else ""
    return (f"{r['model']:<22}{r['workload']:<10}c={r['concurrency']:<3}{r['req_per_s']:>7.1f} img/s  p50 {r['p50_us'] / 1e3:7.2f}"
            f" p99 {r['p99_us'] / 1e3:7.2f} ms  stub cpu ms/img {stub / 1e3:5.2f}  busy {r['cpu']['machine_busy_pct']}%"
            f"  batch {batch:4.1f}  pool waits {m.get('fastpath_pool_waits_total', 0):g} fallbacks {m.get('fastpath_pool_fallbacks_total', 0):g}{h2d}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=Path, required=True, help="photos from benchmarks/gpu/detection_inputs.py")
    parser.add_argument("--fp16-models", type=Path, default=None, help="a folder of model.uint8.fp16.*.onnx (python -m "
                        "fastpath.artifacts.detection_fp16) for the text_detection_fp16_* variants, e.g. /tmp/precision")
    parser.add_argument("--device", default="cuda:0")
    # perf_analyzer 2.51 refuses --shared-memory for a model with optional inputs (text_detection's IMAGE and
    # IMAGE_BYTES are both optional), so uint8 IMAGE goes over gRPC only
    parser.add_argument("--cells", default="text_detection:jpeg720:64,32,8,1;text_detection_nvjpeg:jpeg720:64,32,8,1;"
                                           "naive_detection:jpeg720:32,1;text_detection_tf32:jpeg720:64;"
                                           "text_detection:raw720:32;text_detection:png720:32;"
                                           "text_detection:jpegmixed:64;text_detection_nvjpeg:jpegmixed:64")
    parser.add_argument("--raw", default="16,8,16tf32", help="raw in-process pipeline runs: batch sizes, 'tf32' suffix for TF32")
    parser.add_argument("--timeline-cells", default="", help="MODEL:WORKLOAD:C;...: FastPath's timeline of these cells "
                        "(per stage: busy time, threads, overlap with the engine; benchmarks/timeline.py); list them last")
    parser.add_argument("--py-spy-cells", default="", help="MODEL:WORKLOAD:C;...: py-spy dumps of the stub during these cells")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--skip-numerics", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("detection_gpu.json"))
    args = parser.parse_args()
    fp16 = sorted(m for m in named_models(args.cells, args.py_spy_cells) if m.startswith("text_detection_fp16_"))
    if fp16 and not (args.fp16_models and any(args.fp16_models.glob(CANDIDATE_GLOB))):
        parser.error(f"cells name {fp16}: give --fp16-models, a folder of model.uint8.fp16.*.onnx "
                     f"(python -m fastpath.artifacts.detection_fp16 --out DIR); got {args.fp16_models}")
    root = Path(tempfile.mkdtemp(prefix="detection-gpu-"))
    report: dict = {"command": " ".join(sys.argv)}
    photos = sorted(args.inputs.glob("*.jpg")) + sorted(args.inputs.glob("*.png"))
    if not args.skip_numerics:
        report["numerics"] = numerics([p for p in photos if not p.name.startswith("720_")] + photos[:2], args.device)
        print("numerics vs the CPU path:", report["numerics"]["summary"], flush=True)
    jpegs = [p.read_bytes() for p in sorted(args.inputs.glob("720_*.jpg"))]
    report["pinned_h2d_GBps"] = pinned_h2d_GBps(args.device)
    report["raw"] = []
    for spec in filter(None, args.raw.split(",")):
        batch, tf32 = int(spec.removesuffix("tf32")), spec.endswith("tf32")
        report["raw"].append(raw_pipeline(jpegs, args.device, batch, tf32=tf32))
        print("raw pipeline", {k: v for k, v in report["raw"][-1].items() if k != "engine"}, flush=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    if not args.skip_serve:
        args.report = report
        report["served"] = serve(args, input_files(root, args.inputs), root)
        for row in report["served"]["rows"]:
            tf32 = row["model"].endswith("_tf32")
            best_raw = max((r["images_per_s"] for r in report["raw"] if r["tf32"] == tf32), default=None)
            row["vs_raw_pipeline"] = round(row["req_per_s"] / best_raw, 3) if best_raw else None
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\npinned H2D", report["pinned_h2d_GBps"], "GB/s")
    for row in report.get("served", {}).get("rows", []):
        print(line(row), " vs raw", row["vs_raw_pipeline"])
    print("engine stats:", report.get("served", {}).get("engine_stats_in_log"))
    print("failed cells:", report.get("served", {}).get("failed_cells"), "crashes:", report.get("served", {}).get("stub_crashes_in_log"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
