"""H200 benchmark of fastpath.memory: numerics, H2D bandwidth, batch staging, steady-state allocations.

What it measures is the staging pool as the served paths use it: a batch's request tensors copied
once into one page-locked block (:func:`fastpath.memory.stage`), then one ``cudaMemcpyAsync`` to a
device buffer on a stream (:class:`Harness`).

Run on the GPU machine from the repository root (numpy 1.26 or 2.x, cuda-bindings, optional torch)::

    PYTHONPATH=backend PYTHONUNBUFFERED=1 python3 benchmarks/gpu/memory_bench.py --out "$OUT"

Writes ``memory_bench.json`` and ``memory_bench.log`` to ``--out`` and prints a short table last.
Timing: CUDA events on the copy stream for bandwidth (median of ``--reps``), wall clock
(``perf_counter`` after a final synchronize) for the batch-staging variants, which include host work.
Every timed variant is run side by side in this one process, so ratios are comparable.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fastpath.memory import ParallelCopier, PoolConfig, create_host_pool, cuda_call, probe_cuda, stage
from fastpath.memory.cuda import runtime

KIB, MIB = 1 << 10, 1 << 20
SIZES = (4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
IMAGE_SHAPE = (3, 960, 960)  # fp32, 11.06 MB each
BATCH_IMAGES = 32
DEFAULT_COPY_WORKERS = 4  # the staging threads the batch-staging speed-up is reported for
log = logging.getLogger("memory_bench")


class Harness:
    """A page-locked staging pool, one non-blocking stream and one device buffer of ``device_bytes``."""

    def __init__(self, pool_config: PoolConfig, device_bytes: int) -> None:
        cudart = runtime()
        self.host_pool = create_host_pool(pool_config, allocator="cuda-pinned", name="host")
        self.stream = cuda_call(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self.device = cuda_call(cudart.cudaMalloc(device_bytes), f"cudaMalloc({device_bytes})")
        self.device_bytes = device_bytes
        self.h2d_copies = 0

    def upload(self, name, parts, copier=None):
        """Stage ``parts`` into one pool block, one H2D copy into the device buffer, wait; returns (shape, dtype)."""
        cudart = runtime()
        with stage(self.host_pool, name, parts, copier=copier) as staged:
            if staged.nbytes:
                kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
                cuda_call(cudart.cudaMemcpyAsync(self.device, staged.lease.address, staged.nbytes, kind, self.stream), "h2d")
                self.h2d_copies += 1
            self.synchronize()  # the block goes back to the pool only once its DMA has finished
            return staged.array.shape, staged.array.dtype

    def download(self, shape, dtype):
        """The device buffer's first bytes as a new host array of ``shape`` and ``dtype``."""
        cudart = runtime()
        host = np.empty(shape, dtype)
        if host.nbytes:
            cuda_call(cudart.cudaMemcpy(int(host.ctypes.data), self.device, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "d2h")
        return host

    def synchronize(self):
        cuda_call(runtime().cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def close(self):
        cudart = runtime()
        cuda_call(cudart.cudaFree(self.device), "cudaFree")
        cuda_call(cudart.cudaStreamDestroy(self.stream), "cudaStreamDestroy")
        return self.host_pool.close()


class Timer:
    """CUDA-event timing of work issued on one stream."""

    def __init__(self, stream):
        cudart = runtime()
        self.cudart, self.stream = cudart, stream
        self.start = cuda_call(cudart.cudaEventCreate())
        self.end = cuda_call(cudart.cudaEventCreate())

    def time_ms(self, issue, iterations):
        cuda_call(self.cudart.cudaEventRecord(self.start, self.stream))
        for _ in range(iterations):
            issue()
        cuda_call(self.cudart.cudaEventRecord(self.end, self.stream))
        cuda_call(self.cudart.cudaEventSynchronize(self.end))
        return float(cuda_call(self.cudart.cudaEventElapsedTime(self.start, self.end)))


def h2d(stream, dst, src, nbytes):
    cudart = runtime()
    return lambda: cuda_call(cudart.cudaMemcpyAsync(dst, src, nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream))


def bandwidth(args, path):
    """GB/s host-to-device from: a pool block, raw cudaHostAlloc memory, pageable numpy, and lease+copy+release."""
    cudart, stream = runtime(), path.stream
    timer = Timer(stream)
    device = cuda_call(cudart.cudaMalloc(max(SIZES)))
    raw = cuda_call(cudart.cudaHostAlloc(max(SIZES), cudart.cudaHostAllocPortable))
    pageable = np.random.default_rng(0).integers(0, 255, max(SIZES), dtype=np.uint8)  # touched, resident
    np.frombuffer((ctypes.c_ubyte * max(SIZES)).from_address(raw), np.uint8)[:] = pageable
    rows = []
    for nbytes in SIZES:
        iterations = int(min(200, max(3, (64 * MIB) // nbytes)))
        with path.host_pool.lease(nbytes) as lease:
            lease.view(np.uint8, nbytes)[:] = pageable[:nbytes]
            variants = {
                "pool": h2d(stream, device, lease.address, nbytes),
                "raw_pinned": h2d(stream, device, raw, nbytes),
                "pageable": h2d(stream, device, int(pageable.ctypes.data), nbytes),
            }

            def leased_copy(nbytes=nbytes):
                # host overhead of a lease per copy; releasing before the DMA ends is safe here only
                # because every copy just reads (Harness.upload waits for its copy instead)
                with path.host_pool.lease(nbytes) as each:
                    h2d(stream, device, each.address, nbytes)()

            variants["pool_lease_each_copy"] = leased_copy
            row = {"bytes": nbytes, "iterations": iterations}
            for name, issue in variants.items():
                timer.time_ms(issue, 2)  # warm-up
                times = [timer.time_ms(issue, iterations) for _ in range(args.reps)]
                row[f"{name}_gbps"] = nbytes * iterations / (statistics.median(times) * 1e-3) / 1e9
            row["pool_over_raw"] = row["pool_gbps"] / row["raw_pinned_gbps"]
            rows.append(row)
            log.info("bandwidth %s", row)
    cuda_call(cudart.cudaFree(device))
    cuda_call(cudart.cudaFreeHost(raw))
    return rows


def wall_ms(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), times


def batch_staging(args, path):
    """32 images 3x960x960 fp32 to the device: pool path vs per-request pageable copies (and variants)."""
    cudart, stream = runtime(), path.stream
    rng = np.random.default_rng(2)
    images = [rng.standard_normal((1, *IMAGE_SHAPE), dtype=np.float32) for _ in range(BATCH_IMAGES)]
    total = sum(image.nbytes for image in images)
    device = cuda_call(cudart.cudaMalloc(total))
    kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    sync = lambda: cuda_call(cudart.cudaStreamSynchronize(stream))  # noqa: E731

    def per_request_pageable():
        offset = 0
        for image in images:
            cuda_call(cudart.cudaMemcpyAsync(device + offset, int(image.ctypes.data), image.nbytes, kind, stream))
            offset += image.nbytes
        sync()

    copiers = {workers: ParallelCopier(workers) for workers in sorted({*args.copy_workers, DEFAULT_COPY_WORKERS})}

    def pool_one_copy(copier):
        return lambda: path.upload("images", images, copier)

    def pool_staging_only():
        with path.host_pool.lease(total) as lease:
            np.concatenate(images, axis=0, out=lease.view(np.float32, (BATCH_IMAGES, *IMAGE_SHAPE)))

    def pool_pipelined():  # informative: one copy per request, overlapping staging with DMA
        with path.host_pool.lease(total) as lease:
            offset = 0
            for image in images:
                lease.view(np.uint8, image.nbytes, offset)[:] = image.reshape(-1).view(np.uint8)
                cuda_call(cudart.cudaMemcpyAsync(device + offset, lease.address + offset, image.nbytes, kind, stream))
                offset += image.nbytes
            sync()

    variants = {"per_request_pageable": per_request_pageable, "pool_1_copy_thread": pool_one_copy(None)}
    variants.update({f"pool_{workers}_copy_threads": pool_one_copy(copier) for workers, copier in copiers.items()})
    variants.update({"pool_staging_copy_only_1_thread": pool_staging_only, "pool_pipelined_per_request_1_thread": pool_pipelined})
    result = {"images": BATCH_IMAGES, "image_shape": list(IMAGE_SHAPE), "batch_bytes": total}
    for name, fn in variants.items():
        fn()  # warm-up (first lease allocates the block)
        median, times = wall_ms(fn, args.reps)
        result[f"{name}_ms"] = median
        result[f"{name}_gbps"] = total / (median * 1e-3) / 1e9
        log.info("batch %s: median %.2f ms %s", name, median, [round(t, 2) for t in times])
    # numerics: what the pool path put on the device equals the concatenated requests
    back = path.download(*path.upload("images", images, copiers[DEFAULT_COPY_WORKERS]))
    result["numerics_exact"] = bool(np.array_equal(back, np.concatenate(images)))
    result["default_copy_workers"] = DEFAULT_COPY_WORKERS
    for copier in copiers.values():
        copier.close()
    cuda_call(cudart.cudaFree(device))
    default_key = f"pool_{DEFAULT_COPY_WORKERS}_copy_threads"
    result["pool_default_speedup_vs_per_request_pageable"] = result["per_request_pageable_ms"] / result[default_key + "_ms"]
    return result


def numerics(path):
    """Round trips of several dtypes through a staged block and the device, poisoned and fresh each time."""
    cudart = runtime()
    rng = np.random.default_rng()
    checks = []
    for dtype in (np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_):
        parts = [(rng.standard_normal((n, 7, 33)) * 1000).astype(dtype) for n in (1, 4, 3)]
        parts.append(np.empty((0, 7, 33), dtype))
        cuda_call(cudart.cudaMemsetAsync(path.device, 0xAB, path.device_bytes, path.stream))  # poison
        host = path.download(*path.upload("x", parts))
        checks.append({"dtype": np.dtype(dtype).name, "exact": bool(np.array_equal(host, np.concatenate(parts)))})
    return checks


def steady_state(path, requests=400):
    """Host pool allocations per request after warm-up: must be 0."""
    rng = np.random.default_rng(3)
    request_sizes = rng.integers(1, 5, requests)  # 1..4 rows of 128 int64 ids: 8..32 KiB per batch of 8

    def serve(chunk):
        ids = [rng.integers(0, 30000, (int(n), 128), dtype=np.int64) for n in chunk]
        images = [rng.standard_normal((1, 3, 224, 224), dtype=np.float32) for _ in chunk]
        path.upload("input_ids", ids)
        path.upload("empty", [np.empty((0, 4), np.float32)])
        assert np.array_equal(path.download(*path.upload("pixels", images)), np.concatenate(images))

    for rows in (1, 2, 4):  # warm-up: one batch per size class the workload uses (8, 16, 32 KiB)
        serve([rows] * 8)
    host, copies = path.host_pool.allocator.allocations, path.h2d_copies
    for start in range(0, requests, 8):
        serve(request_sizes[start : start + 8])
    return {
        "requests_measured": requests,
        "host_allocations_per_request": (path.host_pool.allocator.allocations - host) / requests,
        "h2d_copies": path.h2d_copies - copies,
        "host_pool": path.host_pool.stats().as_dict(),
    }


def run_tests(out: Path):
    command = [sys.executable, "-m", "pytest", "tests/gpu", "tests/unit/memory", "-q", "-p", "no:cacheprovider", "-rs"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    (out / "memory_tests.log").write_text(proc.stdout + proc.stderr)
    summary = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    log.info("pytest: %s (exit %d)", summary, proc.returncode)
    return {"command": " ".join(command[1:]), "exit_code": proc.returncode, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for memory_bench.json and memory_bench.log")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per variant (median reported)")
    parser.add_argument("--copy-workers", type=lambda text: [int(part) for part in text.split(",")], default=[2, 4, 8],
                        help="comma-separated staging thread counts to time (default 2,4,8)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.FileHandler(args.out / "memory_bench.log"), logging.StreamHandler(sys.stdout)])
    probe = probe_cuda()
    log.info("probe: %s; numpy %s; python %s", probe.reason, np.__version__, platform.python_version())
    if not probe.available:
        log.error("no CUDA device: nothing to measure")
        return 2
    path = Harness(PoolConfig(capacity_bytes=1536 * MIB, max_block_bytes=512 * MIB, wait_timeout_s=5.0),
                   device_bytes=BATCH_IMAGES * int(np.prod(IMAGE_SHAPE)) * 4)
    result = {"device": probe.device_name, "numpy": np.__version__, "python": platform.python_version()}
    result["numerics"] = numerics(path)
    result["bandwidth"] = bandwidth(args, path)
    result["batch_staging"] = batch_staging(args, path)
    result["steady_state"] = steady_state(path)
    result["leak_reports_ok"] = path.close().ok
    result["tests"] = run_tests(args.out)
    (args.out / "memory_bench.json").write_text(json.dumps(result, indent=2, default=str))
    print_table(result)
    ok = all(c["exact"] for c in result["numerics"]) and result["batch_staging"]["numerics_exact"]
    ok = ok and result["leak_reports_ok"] and result["tests"]["exit_code"] == 0
    return 0 if ok else 1


def print_table(result):
    lines = [f"device {result['device']}, numpy {result['numpy']}",
             "numerics exact: " + ", ".join(f"{c['dtype']}={c['exact']}" for c in result["numerics"]),
             f"{'H2D size':>10} {'pool':>8} {'raw pin':>8} {'pageable':>8} {'lease+cp':>8} {'pool/raw':>8}  (GB/s)"]
    for row in result["bandwidth"]:
        size = f"{row['bytes'] // KIB} KiB" if row["bytes"] < MIB else f"{row['bytes'] // MIB} MiB"
        lines.append(f"{size:>10} {row['pool_gbps']:8.2f} {row['raw_pinned_gbps']:8.2f} {row['pageable_gbps']:8.2f} "
                     f"{row['pool_lease_each_copy_gbps']:8.2f} {row['pool_over_raw']:8.3f}")
    staging = result["batch_staging"]
    lines.append(f"batch 32x3x960x960 fp32 ({staging['batch_bytes'] / 1e6:.0f} MB) to the device, median:")
    for key in [key[:-3] for key in staging if key.endswith("_ms")]:
        lines.append(f"  {key:<36} {staging[key + '_ms']:8.2f} ms {staging[key + '_gbps']:7.2f} GB/s")
    lines.append(f"  numerics exact {staging['numerics_exact']}; pool path (default {staging['default_copy_workers']} copy threads) "
                 f"vs per-request pageable: speed-up {staging['pool_default_speedup_vs_per_request_pageable']:.2f}x")
    steady = result["steady_state"]
    lines.append(f"steady state over {steady['requests_measured']} requests: host allocations/request "
                 f"{steady['host_allocations_per_request']:.3f}, {steady['h2d_copies']} H2D copies")
    lines.append(f"leak reports ok {result['leak_reports_ok']}; pytest: {result['tests']['summary']}")
    log.info("summary\n%s", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
