"""Why the served H2D reads slower than a bare pinned copy: the memory, the API, or the host's gap before the copy.

text_detection's engine (``engines/onnxruntime/image_cuda.py``) times each H2D as ``cudaEventRecord(start)``,
``cudaMemcpyAsync`` from a staging-pool block (``cudaHostAlloc`` portable), ``cudaEventRecord(end)`` on its own
non-blocking stream, all through cuda-python. The GPU stamps ``start`` as soon as the idle stream reaches it, so
the span also holds whatever the host takes to issue the copy after it: cuda-python's call overhead and, in a
busy stub, the wait for the GIL. This measures, one process, at the sizes the served path copies (one 1280x720
photo resized to 736x1312, uint8, 2.9 MB; a batch of 7, 20 MB; of 16, 46 MB):

  torch pinned        torch's pinned tensor, ``copy_`` on a stream, events around it (the bare pinned figure)
  pool, engine calls  a FastPath ``CudaPinnedAllocator`` block, the engine's exact cuda-python sequence
  torch memory, engine calls   the engine's sequence from torch's pinned memory (isolates the allocation)
  pageable, engine calls       the engine's sequence from a plain numpy array (what unpinned memory gives)
  ... gated           the same, with the stream held by a ~20 ms GPU sleep until all three calls are issued: the
                      events then bracket the DMA alone
  pool, GIL held      the engine's copy as shipped: the three calls through ``enqueue_timed_copy``, which keeps
                      the GIL between them (``fastpath.memory.cuda``); "GIL busy" beside it is the served case
  ... GIL busy        three Python threads spinning meanwhile (as the stub's decode, post and stage threads)

``--study conditions`` asks the next question: with the copy held, which of the served path's conditions keeps
it below the back-to-back figure (one block copied again and again), for the pool's held copy and for torch's
pinned ``copy_`` alike, at 1, 7.5 (a c=64 call) and 16 images:

  back to back     the same block, copied again as soon as the last copy finished
  idle 5 ms        the host sleeps 5 ms before each copy (the card has nothing else to do meanwhile)
  written          the CPU rewrites the block (``np.copyto``) just before each copy, as staging does
  rotating         each copy reads the next of 8 blocks, as the staging pool hands them out
  served-like      all three in the served order: the next block, 5 ms idle, the CPU writes it, the copy
  primed           served-like, with a 64 KB copy from the block (untimed, synchronized) before the timed one

Run on the device machine: ``PYTHONPATH=backend python3 benchmarks/gpu/h2d_served_path.py --out $OUT/h2d_served_path.json``
(add ``--study conditions``; the device image's torch, numpy and cuda-bindings; no bundle). Prints median GB/s
(and microseconds, for conditions) per size and variant, and writes the JSON. Without CUDA it exits 2 naming
what is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
import time
from typing import Any

IMAGE_BYTES = 736 * 1312 * 3
SIZES = {"1 image": IMAGE_BYTES, "7 images": 7 * IMAGE_BYTES, "16 images": 16 * IMAGE_BYTES}
SLEEP_CYCLES = 40_000_000  # torch.cuda._sleep: ~20 ms at ~2 GHz, longer than issuing three calls even behind a busy GIL
CONDITION_SIZES = {"1 image": IMAGE_BYTES, "7.5 images": int(7.5 * IMAGE_BYTES), "16 images": 16 * IMAGE_BYTES}
BLOCKS, IDLE_S, PRIME_BYTES = 8, 0.005, 64 * 1024
CONDITIONS = {  # name: (rotating, written, idle, primed)
    "back to back": (False, False, False, False),
    "idle 5 ms": (False, False, True, False),
    "written": (False, True, False, False),
    "rotating": (True, False, False, False),
    "served-like": (True, True, True, False),
    "primed": (True, True, True, True),
}


def spin(stop: threading.Event) -> None:
    """Pure-Python work that holds the GIL between switch intervals."""
    total = 0
    while not stop.is_set():
        for value in range(1000):
            total += value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--study", choices=("api", "conditions"), default="api")
    parser.add_argument("--copies", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        from cuda.bindings import runtime as cudart  # noqa: F401 - probe

        from fastpath.memory.allocators import CudaPinnedAllocator
        from fastpath.memory.cuda import cuda_call, enqueue_timed_copy, runtime
    except ImportError as exc:
        print(f"needs torch, numpy, cuda-bindings and backend/ on PYTHONPATH: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.cuda.init()
    cudart = runtime()
    cuda_call(cudart.cudaSetDevice(0), "cudaSetDevice")
    stream = cuda_call(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
    bench = Bench(np, torch, cudart, cuda_call, enqueue_timed_copy, CudaPinnedAllocator(0), stream,
                  torch.cuda.ExternalStream(int(stream)), [cuda_call(cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(2)])
    record = (conditions_study if args.study == "conditions" else api_study)(bench, args.copies)
    with open(args.out, "w") as handle:
        json.dump({"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "copies": args.copies, "switch_interval_s": sys.getswitchinterval(), **record,
                   "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, handle, indent=1)
    return 0


@dataclasses.dataclass
class Bench:
    """What both studies use: the modules, one pinned allocator, a non-blocking stream (also as torch's) and two events."""

    np: Any
    torch: Any
    cudart: Any
    cuda_call: Any
    enqueue_timed_copy: Any
    allocator: Any
    stream: Any
    torch_stream: Any
    events: list

    def held_copy(self, dst: int, src: int, nbytes: int) -> float:
        """The engine's copy as shipped (``enqueue_timed_copy``); waits for it; its seconds by CUDA events."""
        start, end = self.events
        if not self.enqueue_timed_copy(start, end, dst, src, nbytes, self.stream):
            raise RuntimeError("enqueue_timed_copy refused a pool block: not page-locked, or no libcuda.so.1")
        return self.elapsed()

    def elapsed(self) -> float:
        """Seconds between the two events, once the second has completed."""
        start, end = self.events
        self.cuda_call(self.cudart.cudaEventSynchronize(end), "cudaEventSynchronize")
        return self.cuda_call(self.cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime") * 1e-3

    def torch_copy(self, device: Any, host: Any, nbytes: int, gated: bool = False) -> float:
        """torch's pinned ``copy_`` of ``nbytes`` on the stream, between torch events (after a GPU sleep if ``gated``)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.torch_stream):
            if gated:
                torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            device[:nbytes].copy_(host[:nbytes], non_blocking=True)
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3


def api_study(bench: Bench, copies: int) -> dict[str, Any]:
    """The memory and the API of the copy, with and without busy Python threads (the module's first table)."""
    np, torch, cudart, cuda_call = bench.np, bench.torch, bench.cudart, bench.cuda_call
    largest = max(SIZES.values())
    pool_block = bench.allocator.allocate(largest)
    torch_host = torch.full((largest,), 7, dtype=torch.uint8).pin_memory()
    pageable = np.full(largest, 7, np.uint8)
    device = torch.empty(largest, dtype=torch.uint8, device="cuda")
    h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    sources = {"pool": pool_block.address, "torch memory": torch_host.data_ptr(), "pageable": pageable.ctypes.data}

    def engine_copy(src: int, nbytes: int, gated: bool, held: bool = False) -> float:
        start, end = bench.events
        if gated:
            with torch.cuda.stream(bench.torch_stream):
                torch.cuda._sleep(SLEEP_CYCLES)
        if held:
            return bench.held_copy(device.data_ptr(), src, nbytes)
        cuda_call(cudart.cudaEventRecord(start, bench.stream), "cudaEventRecord")
        cuda_call(cudart.cudaMemcpyAsync(device.data_ptr(), src, nbytes, h2d, bench.stream), "cudaMemcpyAsync")
        cuda_call(cudart.cudaEventRecord(end, bench.stream), "cudaEventRecord")
        return bench.elapsed()

    pool_block.array[:largest] = np.arange(largest, dtype=np.uint64).astype(np.uint8)  # numerics: the held copy moves the bytes
    engine_copy(pool_block.address, largest, False, held=True)
    copied_equal = bool(torch.equal(device.cpu(), torch.from_numpy(pool_block.array[:largest].copy())))
    print(f"held copy of {largest} bytes equal on the device: {copied_equal}", flush=True)
    variants = {"pool, GIL held": ("pool", False, False, True), "pool, GIL held, GIL busy": ("pool", False, True, True)}
    # the most telling first: a device call cut short still answers them
    for source, gated, gil in [(None, False, False), ("pool", False, False), ("pool", False, True), ("pool", True, False),
                               ("pool", True, True), (None, True, False), (None, False, True), ("torch memory", False, False),
                               ("torch memory", True, False), ("pageable", False, False), ("pageable", True, False)]:
        suffix = (", gated" if gated else "") + (", GIL busy" if gil else "")
        variants[f"torch pinned{suffix}" if source is None else f"{source}, engine calls{suffix}"] = (source, gated, gil, False)
    results: dict[str, dict[str, float]] = {}
    for variant, (source, gated, gil, held) in variants.items():
        stop = threading.Event()
        threads = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(3 if gil else 0)]
        for thread in threads:
            thread.start()
        try:
            results[variant] = {}
            for label, nbytes in SIZES.items():
                seconds = []
                for index in range(copies + 3):
                    took = (bench.torch_copy(device, torch_host, nbytes, gated) if source is None
                            else engine_copy(sources[source], nbytes, gated, held))
                    if index >= 3:
                        seconds.append(took)
                results[variant][label] = nbytes / statistics.median(seconds) / 1e9
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        print(f"{variant}: " + ", ".join(f"{label} {gbps:.1f}" for label, gbps in results[variant].items()), flush=True)
    print()
    print(f"{'variant (median GB/s, CUDA events)':<44}" + "".join(f"{label:>12}" for label in SIZES))
    for variant, row in results.items():
        print(f"{variant:<44}" + "".join(f"{row[label]:>12.1f}" for label in SIZES))
    bench.allocator.free(pool_block)
    return {"sizes": SIZES, "held_copy_bytes_equal": copied_equal, "gbps_median": results}


def conditions_study(bench: Bench, copies: int) -> dict[str, Any]:
    """The held copy and torch's pinned copy under each of :data:`CONDITIONS` (the module's second table)."""
    np, torch, cudart, cuda_call = bench.np, bench.torch, bench.cudart, bench.cuda_call
    largest = max(CONDITION_SIZES.values())
    pool_blocks = [bench.allocator.allocate(largest) for _ in range(BLOCKS)]
    torch_blocks = [torch.empty(largest, dtype=torch.uint8).pin_memory() for _ in range(BLOCKS)]
    source = np.random.default_rng(0).integers(0, 256, largest, dtype=np.uint8)
    for block, tensor in zip(pool_blocks, torch_blocks):
        block.array[:largest] = source
        tensor.numpy()[:] = source
    device = torch.empty(largest, dtype=torch.uint8, device="cuda")
    h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    bench.held_copy(device.data_ptr(), pool_blocks[0].address, largest)
    copied_equal = bool(torch.equal(device.cpu(), torch.from_numpy(source)))
    print(f"pool block of {largest} bytes equal on the device after the held copy: {copied_equal}", flush=True)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for api in ("pool, held copy", "torch pinned"):
        pool = api.startswith("pool")
        for condition, (rotating, written, idle, primed) in CONDITIONS.items():
            row = results.setdefault(f"{api}, {condition}", {})
            for label, nbytes in CONDITION_SIZES.items():
                seconds = []
                for step in range(copies + 3):
                    index = step % BLOCKS if rotating else 0
                    host = pool_blocks[index].array if pool else torch_blocks[index].numpy()
                    if idle:
                        time.sleep(IDLE_S)
                    if written:
                        np.copyto(host[:nbytes], source[:nbytes])
                    if primed:
                        cuda_call(cudart.cudaMemcpyAsync(device.data_ptr(), host.ctypes.data, PRIME_BYTES, h2d, bench.stream),
                                  "cudaMemcpyAsync")
                        cuda_call(cudart.cudaStreamSynchronize(bench.stream), "cudaStreamSynchronize")
                    took = (bench.held_copy(device.data_ptr(), pool_blocks[index].address, nbytes) if pool
                            else bench.torch_copy(device, torch_blocks[index], nbytes))
                    if step >= 3:
                        seconds.append(took)
                median = statistics.median(seconds)
                row[label] = {"gbps": nbytes / median / 1e9, "us": median * 1e6}
            print(f"{api}, {condition}: " + ", ".join(f"{k} {v['gbps']:.1f} GB/s {v['us']:.0f} us" for k, v in row.items()),
                  flush=True)
    print()
    print(f"{'variant (median GB/s | us, CUDA events)':<40}" + "".join(f"{label:>18}" for label in CONDITION_SIZES))
    for variant, row in results.items():
        print(f"{variant:<40}" + "".join(f"{row[label]['gbps']:>10.1f} | {row[label]['us']:>5.0f}" for label in CONDITION_SIZES))
    for block in pool_blocks:
        bench.allocator.free(block)
    return {"sizes": CONDITION_SIZES, "blocks": BLOCKS, "idle_s": IDLE_S, "prime_bytes": PRIME_BYTES,
            "held_copy_bytes_equal": copied_equal, "median": results}


if __name__ == "__main__":
    sys.exit(main())
