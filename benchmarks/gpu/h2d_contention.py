"""What slows a pinned host-to-device copy under served load: the GPU's compute, other processes' copies, or host memory traffic.

text_detection's served H2D ran at 0.43x a bare pinned copy (docs/benchmarks/detection_gpu_h100.md, run 7), and the
raw in-process pipeline's halved the same way under its own load. This separates the loads. One process copies a
pinned torch tensor to the GPU on a stream of its own, timed by CUDA events (as the engine's
``fastpath_engine_h2d_seconds_total``) and by the host (enqueue to the end event's completion), at the sizes the
served path copies: one 1280x720 photo resized to 736x1312 (uint8, 2.9 MB), a batch of 8 (23 MB) and of 16 (46 MB).
Around it, each condition starts helper processes (spawned, each its own CUDA context, as the stubs of a
three-instance model are) or a helper thread in the copying process:

  compute       fp32 3x3 convolutions (TF32 off) on the GPU, back to back
  engine        what an instance does: H2D of a batch of 8, convolutions, D2H of its float32 maps (31 MB)
  copy          H2D of a batch of 8, back to back
  host          memcpy of 256 MB arrays on the CPU (host memory traffic, as decode and staging threads make)

Run on the device machine: ``python3 benchmarks/gpu/h2d_contention.py --out $OUT/h2d_contention.json`` (the device
image's torch; no bundle needed). Prints a table (median GB/s per size and condition, and the ratio to idle) and
writes the JSON. Without CUDA it exits 2 naming what is missing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time

IMAGE_BYTES = 736 * 1312 * 3  # one 1280x720 photo under min/736, uint8 RGB
MAP_BYTES = 736 * 1312 * 4  # its float32 probability map
SIZES = {"1 image": IMAGE_BYTES, "8 images": 8 * IMAGE_BYTES, "16 images": 16 * IMAGE_BYTES}
CONDITIONS = {  # name: (the kind of each helper process, the kind of a helper thread in the copying process)
    "idle": ((), None),
    "compute, same process": ((), "compute"),
    "compute, 1 process": (("compute",), None),
    "compute, 2 processes": (("compute",) * 2, None),
    "engine, 2 processes": (("engine",) * 2, None),
    "copy, 2 processes": (("copy",) * 2, None),
    "host memcpy, 4 processes": (("host",) * 4, None),
    "host memcpy, 12 processes": (("host",) * 12, None),
    "engine, 2 processes + host memcpy, 4": (("engine",) * 2 + ("host",) * 4, None),
}


def gpu_load(kind: str, stop, ready=None) -> None:
    """Loop ``kind`` ("compute", "engine" or "copy") on the GPU until ``stop`` is set."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(4, 64, 184, 328, device="cuda")
        conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
        host_in = torch.empty(8 * IMAGE_BYTES, dtype=torch.uint8).pin_memory()
        host_out = torch.empty(8 * MAP_BYTES, dtype=torch.uint8).pin_memory()
        dev_in = torch.empty_like(host_in, device="cuda")
        dev_out = torch.empty_like(host_out, device="cuda")
        with torch.no_grad():
            for _ in range(3):
                conv(x)
        stream.synchronize()
        if ready is not None:
            ready.set()
        with torch.no_grad():
            while not stop.is_set():
                if kind in ("engine", "copy"):
                    dev_in.copy_(host_in, non_blocking=True)
                if kind in ("engine", "compute"):
                    for _ in range(4):
                        conv(x)
                if kind == "engine":
                    host_out.copy_(dev_out, non_blocking=True)
                stream.synchronize()


def host_load(stop, ready) -> None:
    """Copy 256 MB arrays on the CPU until ``stop`` is set (one thread: DRAM traffic, no GPU)."""
    import torch

    torch.set_num_threads(1)
    src, dst = torch.ones(256 << 20, dtype=torch.uint8), torch.empty(256 << 20, dtype=torch.uint8)
    ready.set()
    while not stop.is_set():
        dst.copy_(src)


def helper(kind: str, stop, ready) -> None:
    if kind == "host":
        host_load(stop, ready)
    else:
        gpu_load(kind, stop, ready)


def measure(copies: int) -> dict:
    """Median/p10/p90 GB/s of ``copies`` pinned H2D copies per size: CUDA events and the host's clock."""
    import torch

    stream = torch.cuda.Stream()
    out = {}
    for label, nbytes in SIZES.items():
        src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        event_s, host_s = [], []
        for index in range(copies + 3):
            began = time.perf_counter()
            start.record(stream)
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
            end.record(stream)
            end.synchronize()
            if index >= 3:  # the first copies warm the path
                host_s.append(time.perf_counter() - began)
                event_s.append(start.elapsed_time(end) / 1e3)
        rates = sorted(nbytes / s / 1e9 for s in event_s)
        out[label] = {"bytes": nbytes, "event_gbps_median": statistics.median(rates), "event_gbps_p10": rates[len(rates) // 10],
                      "event_gbps_p90": rates[(9 * len(rates)) // 10],
                      "host_gbps_median": nbytes / statistics.median(host_s) / 1e9}
    return out


def run_condition(name: str, copies: int) -> dict:
    kinds, thread_kind = CONDITIONS[name]
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    helpers, readies = [], []
    for helper_kind in kinds:
        ready = ctx.Event()
        helpers.append(ctx.Process(target=helper, args=(helper_kind, stop, ready), daemon=True))
        readies.append(ready)
        helpers[-1].start()
    thread_stop = threading.Event()
    thread = None
    if thread_kind:
        thread_ready = threading.Event()
        thread = threading.Thread(target=gpu_load, args=(thread_kind, thread_stop, thread_ready), daemon=True)
        thread.start()
        readies.append(thread_ready)
    try:
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError(f"{name}: a helper did not start within 120 s")
        time.sleep(1.0)  # the loads reach their steady state
        result = measure(copies)
    finally:
        stop.set()
        thread_stop.set()
        for process in helpers:
            process.join(30)
        if thread is not None:
            thread.join(30)
    return {"helpers": list(kinds), "thread": thread_kind, "sizes": result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=40, help="timed copies per size and condition")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("h2d_contention: torch is not installed; it needs torch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("h2d_contention: no CUDA device; it runs on a GPU machine", file=sys.stderr)
        return 2
    results = {}
    for name in CONDITIONS:
        results[name] = run_condition(name, args.copies)
        print(f"{name}: " + ", ".join(f"{label} {row['event_gbps_median']:.1f}" for label, row in results[name]["sizes"].items()),
              flush=True)
    idle = results["idle"]["sizes"]
    print(f"\n{'condition':40s}" + "".join(f"{label:>22s}" for label in SIZES))
    for name, row in results.items():
        cells = "".join(f"{row['sizes'][label]['event_gbps_median']:8.1f} GB/s ({row['sizes'][label]['event_gbps_median'] / idle[label]['event_gbps_median']:.2f}x)"
                        for label in SIZES)
        print(f"{name:40s}{cells}")
    document = {"command": "python3 " + " ".join(sys.argv), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                "copies": args.copies, "conditions": results}
    with open(args.out, "w") as handle:
        json.dump(document, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
