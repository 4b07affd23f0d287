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

Run on the device machine: ``PYTHONPATH=backend python3 benchmarks/gpu/h2d_served_path.py --out $OUT/h2d_served_path.json``
(the device image's torch, numpy and cuda-bindings; no bundle). Prints median GB/s per size and variant, and
writes the JSON. Without CUDA it exits 2 naming what is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

IMAGE_BYTES = 736 * 1312 * 3
SIZES = {"1 image": IMAGE_BYTES, "7 images": 7 * IMAGE_BYTES, "16 images": 16 * IMAGE_BYTES}
SLEEP_CYCLES = 40_000_000  # torch.cuda._sleep: ~20 ms at ~2 GHz, longer than issuing three calls even behind a busy GIL


def spin(stop: threading.Event) -> None:
    """Pure-Python work that holds the GIL between switch intervals."""
    total = 0
    while not stop.is_set():
        for value in range(1000):
            total += value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    stream = cuda_call(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
    torch_stream = torch.cuda.ExternalStream(int(stream))
    events = [cuda_call(cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(2)]
    allocator = CudaPinnedAllocator(0)
    largest = max(SIZES.values())
    pool_block = allocator.allocate(largest)
    pool_block.array[:] = 7
    torch_host = torch.full((largest,), 7, dtype=torch.uint8).pin_memory()
    pageable = np.full(largest, 7, np.uint8)
    device = torch.empty(largest, dtype=torch.uint8, device="cuda")
    h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    sources = {"pool": pool_block.address, "torch memory": torch_host.data_ptr(), "pageable": pageable.ctypes.data}

    def engine_copy(src: int, nbytes: int, gated: bool, held: bool = False) -> float:
        start, end = events
        if gated:
            with torch.cuda.stream(torch_stream):
                torch.cuda._sleep(SLEEP_CYCLES)
        if held:
            if not enqueue_timed_copy(start, end, device.data_ptr(), src, nbytes, stream):
                raise RuntimeError("enqueue_timed_copy refused a pool block: not page-locked, or no libcuda.so.1")
        else:
            cuda_call(cudart.cudaEventRecord(start, stream), "cudaEventRecord")
            cuda_call(cudart.cudaMemcpyAsync(device.data_ptr(), src, nbytes, h2d, stream), "cudaMemcpyAsync")
            cuda_call(cudart.cudaEventRecord(end, stream), "cudaEventRecord")
        cuda_call(cudart.cudaEventSynchronize(end), "cudaEventSynchronize")
        return cuda_call(cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime") * 1e-3

    def torch_copy(nbytes: int, gated: bool) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(torch_stream):
            if gated:
                torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            device[:nbytes].copy_(torch_host[:nbytes], non_blocking=True)
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    cuda_call(cudart.cudaSetDevice(0), "cudaSetDevice")
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
                for index in range(args.copies + 3):
                    took = torch_copy(nbytes, gated) if source is None else engine_copy(sources[source], nbytes, gated, held)
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
    allocator.free(pool_block)
    with open(args.out, "w") as handle:
        json.dump({"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "copies": args.copies, "switch_interval_s": sys.getswitchinterval(), "sizes": SIZES,
                   "held_copy_bytes_equal": copied_equal,
                   "gbps_median": results, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
