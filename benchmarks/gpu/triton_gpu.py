"""text_embedding served by Triton 2.51 on the GPU with FastPath (torch runtime, CUDA graphs, scheduler).

Runs on the device machine (see docs/benchmarks/triton_gpu.md for the exact commands); also on a
CPU machine as a smoke test (``--device cpu``). Steps:
  1. a private model repository: text_embedding with runtime=torch, the given precision and device,
     one CUDA graph per (batch, length) bucket, N instances; fastpath_admin;
  2. tritonserver from the nvidia-pytriton wheel (``FASTPATH_TRITON_DIR``) with this interpreter
     first on PATH (numpy 1.x for the stub);
  3. numerics: served embeddings vs the engine in-process (cosine), K02 neighbour independence;
  4. load: a multi-process gRPC load generator (one text per request, real sentences) at each
     concurrency, and bulk requests of 32 texts; req/s, p50, p99; Triton's server-side split.
     With ``--models`` the same server also serves, side by side in the same run:
       text_embedding_tb  FastPath with ``dynamic_batching { max_queue_delay_microseconds: 0 }``: Triton
                          hands ``execute()`` every request queued meanwhile; answers still go one by
                          one through response senders;
       text_embedding_rt  the same with ``response_mode=return``: ``execute()`` returns its requests'
                          responses, one stub round trip per call (docs/design/scheduler.md);
       naive_embedding    the issue's "one CUDA graph replay per request" baseline (benchmarks/models);
       stack_pad_embedding the issue's "Triton dynamic batcher (200 us) + stacking + graph buckets" baseline.
Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT))


def make_repository(root: Path, version_dir: Path, *, device: str, precision: str, instances: int, delay_us: int) -> Path:
    repository = root / "repo"
    shutil.copytree(ROOT / "model_repository" / "fastpath_admin", repository / "fastpath_admin", ignore=shutil.ignore_patterns("__pycache__"))
    model = repository / "text_embedding"
    (model / "1").mkdir(parents=True)
    for name in ("model.fp16.safetensors", "tokenizer.json", "manifest.json", "golden.npz"):
        if (version_dir / name).exists():
            (model / "1" / name).symlink_to((version_dir / name).resolve())
    (model / "1" / "model.py").write_text(_pin_backend((ROOT / "model_repository" / "text_embedding" / "1" / "model.py").read_text()))
    config = (ROOT / "model_repository" / "text_embedding" / "config.pbtxt").read_text()
    config = config.replace("count: 1", f"count: {instances}")
    lines = [line for line in config.splitlines() if not line.startswith("parameters {")]
    params = {"runtime": "torch", "precision": precision, "device": device, "artifact": "model.fp16.safetensors",
              "max_seq_length": "256", "length_buckets_tokens": "16,32,64,128,256", "batch_buckets": "1,2,4,8,16,32,64",
              "max_queue_delay_us": str(delay_us), "max_queue_texts": "8192"}
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    (model / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return repository


def _pin_backend(code: str) -> str:
    """Make a model.py import ``fastpath`` from this tree's backend/ (not whatever the interpreter has installed)."""
    return f"import sys\nsys.path.insert(0, {str(ROOT / 'backend')!r})\n" + code


def add_variants(repository: Path, version_dir: Path, names: list[str], *, device: str, precision: str, instances: int) -> None:
    """Add the side-by-side models ``names`` (see the module docstring) to ``repository``."""
    base = repository / "text_embedding"
    engine = {"runtime": "torch", "precision": precision, "device": device, "artifact": "model.fp16.safetensors",
              "max_seq_length": "256", "length_buckets_tokens": "16,32,64,128,256"}
    for name in names:
        target = repository / name
        if name in ("text_embedding_tb", "text_embedding_rt"):
            shutil.copytree(base, target, symlinks=True)
            config = (base / "config.pbtxt").read_text().replace('name: "text_embedding"', f'name: "{name}"')
            if name == "text_embedding_rt":
                config += 'parameters { key: "response_mode" value: { string_value: "return" } }\n'
            (target / "config.pbtxt").write_text(config + "dynamic_batching { max_queue_delay_microseconds: 0 }\n")
            continue
        source = ROOT / "benchmarks" / "models" / name
        (target / "1").mkdir(parents=True)
        for item in ("model.fp16.safetensors", "tokenizer.json"):
            (target / "1" / item).symlink_to((version_dir / item).resolve())
        code = (source / "1" / "model.py").read_text().replace(
            "Path(__file__).resolve().parents[2]", repr(str(ROOT / "benchmarks" / "models")))
        (target / "1" / "model.py").write_text(_pin_backend(code))
        config = (source / "config.pbtxt").read_text().replace("count: 1", f"count: {instances}")
        config = config.replace("max_queue_delay_microseconds: 2000", "max_queue_delay_microseconds: 200")
        config += "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in engine.items())
        (target / "config.pbtxt").write_text(config)


def _worker(url: str, model: str, texts: list[str], concurrency: int, duration_s: float, bulk: int, queue) -> None:
    """One load process: ``concurrency`` threads, each with its own synchronous gRPC client.

    (tritonclient.grpc.aio requests hung in spawned processes on the device machine's grpcio; the
    synchronous client in threads works there and releases the GIL while waiting.)
    """
    import threading

    import tritonclient.grpc as grpcclient

    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + duration_s

    def loop(index: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        output = [grpcclient.InferRequestedOutput("EMBEDDING")]
        i = index
        local: list[float] = []
        while time.monotonic() < deadline:
            batch = [texts[(i + k) % len(texts)] for k in range(bulk)]
            i += concurrency * bulk
            tensor = grpcclient.InferInput("TEXT", [bulk, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[t.encode()] for t in batch], dtype=np.object_))
            start = time.perf_counter()
            try:
                client.infer(model, [tensor], outputs=output, client_timeout=20.0)
                local.append(time.perf_counter() - start)
            except Exception as exc:
                with lock:
                    errors[0] += 1
                    if errors[0] <= 3:
                        print("load error:", str(exc)[:300], flush=True)
        with lock:
            latencies.extend(local)
        client.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put((latencies, errors[0]))


def load(url: str, texts: list[str], concurrency: int, duration_s: float, bulk: int = 1, processes: int = 8,
         model: str = "text_embedding") -> dict:
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    queue = mp.get_context("spawn").Queue()
    workers = [mp.get_context("spawn").Process(target=_worker, args=(url, model, texts[i::processes], share, duration_s, bulk, queue))
               for i, share in enumerate(shares)]
    for worker in workers:
        worker.start()
    results = []
    for _ in workers:
        try:
            results.append(queue.get(timeout=duration_s + 60))
        except Exception:  # a worker that hung or died: reported, not fatal
            results.append(([], -1))
    for worker in workers:
        worker.join(30)
    latencies = np.array([x for lat, _ in results for x in lat])
    errors = sum(e for _, e in results)
    return {"model": model, "concurrency": concurrency, "bulk": bulk, "requests": int(latencies.size), "errors": errors,
            "req_per_s": round(latencies.size / duration_s, 1), "texts_per_s": round(latencies.size * bulk / duration_s, 1),
            "p50_ms": round(float(np.percentile(latencies, 50)) * 1e3, 3) if latencies.size else None,
            "p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 3) if latencies.size else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version-dir", type=Path, default=ROOT / "model_repository" / "text_embedding" / "1")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--delay-us", type=int, default=500)
    parser.add_argument("--concurrency", default="1,32,128,256")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--models", default="text_embedding",
                        help="comma list: text_embedding, text_embedding_tb, text_embedding_rt, naive_embedding, stack_pad_embedding")
    parser.add_argument("--no-metrics", action="store_true",
                        help="tritonserver --allow-metrics=false: no custom-metric IPC from the stubs (each update is a round trip)")
    parser.add_argument("--out", type=Path, default=Path("triton_gpu.json"))
    args = parser.parse_args()
    from fastpath.corpus import pydoc_sentences
    from fastpath.server import ServerOptions, TritonServer
    from tests.conftest import free_ports

    texts = pydoc_sentences()
    root = Path(tempfile.mkdtemp(prefix="triton-gpu-"))
    repository = make_repository(root, args.version_dir, device=args.device, precision=args.precision,
                                 instances=args.instances, delay_us=args.delay_us)
    models = args.models.split(",")
    add_variants(repository, args.version_dir, [m for m in models if m != "text_embedding"], device=args.device,
                 precision=args.precision, instances=args.instances)
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port,
                                        metrics_port=metrics_port, host="127.0.0.1", exit_timeout_s=5,
                                        extra_args=("--allow-metrics=false",) if args.no_metrics else (),
                                        models=tuple(dict.fromkeys(["text_embedding", "fastpath_admin"] + models))),
                          log_path=root / "tritonserver.log")
    report: dict = {"command": " ".join(sys.argv), "device": args.device, "precision": args.precision,
                    "instances": args.instances, "delay_us": args.delay_us}
    started = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout_s=400)
        report["load_s"] = round(time.monotonic() - started, 1)
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(server.grpc_url)
        sample = texts[:61] + ["", "hello world", "word " * 400]
        tensor = grpcclient.InferInput("TEXT", [len(sample), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in sample], dtype=np.object_))
        served = client.infer("text_embedding", [tensor]).as_numpy("EMBEDDING")
        golden_texts, golden = None, None
        with np.load(args.version_dir / "golden.npz") as g:
            golden_texts, golden = [str(t) for t in g["texts"]], g["embeddings"]
        tensor = grpcclient.InferInput("TEXT", [len(golden_texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in golden_texts], dtype=np.object_))
        got = client.infer("text_embedding", [tensor]).as_numpy("EMBEDDING")
        cosine = (got * golden).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(golden, axis=1))
        alone = client.infer("text_embedding", [_one(grpcclient, "hello world")]).as_numpy("EMBEDDING")[0]
        report["numerics"] = {"golden_min_cosine_to_fp32": round(float(cosine.min()), 6), "finite": bool(np.isfinite(served).all()),
                              "hello_world_alone_vs_in_batch_max_abs": float(np.abs(alone - served[62]).max())}
        print("numerics", report["numerics"], flush=True)
        sequential = []
        for text in texts[:100]:
            start = time.perf_counter()
            client.infer("text_embedding", [_one(grpcclient, text)], client_timeout=20.0)
            sequential.append(time.perf_counter() - start)
        report["sequential_p50_ms"] = round(float(np.median(sequential)) * 1e3, 3)
        print("sequential one-text p50 ms", report["sequential_p50_ms"], flush=True)
        rows = []
        for model in models:
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                rows.append(load(server.grpc_url, texts, concurrency, args.duration_s, processes=args.processes, model=model))
                print(rows[-1], flush=True)
            rows.append(load(server.grpc_url, texts, 32, args.duration_s, bulk=32, processes=args.processes, model=model))
            print(rows[-1], flush=True)
        if any(r["errors"] for r in rows):  # a hang: dump the stubs' Python stacks into Triton's log
            import signal
            import subprocess

            for pid in subprocess.run(["pgrep", "-f", "triton_python_backend_stub.*text_embedding"], capture_output=True, text=True).stdout.split():
                os.kill(int(pid), signal.SIGUSR1)
            time.sleep(2)
            time.sleep(16)
            dump = Path(os.environ.get("FASTPATH_STACK_DUMP", "/nonexistent"))
            report["stacks"] = dump.read_text().splitlines()[-300:] if dump.exists() else []
        report["load"] = rows
        import urllib.request

        metrics_text = ""
        if not args.no_metrics:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
                metrics_text = reply.read().decode()
        report["fastpath_metrics"] = {model: {name: sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
                                                      if line.startswith(name + "{") and f'model="{model}"' in line)
                                              for name in ("fastpath_batch_size_count", "fastpath_padded_tokens_total",
                                                           "fastpath_real_tokens_total", "nv_inference_exec_count")}
                                      for model in models}
        report["triton_statistics"] = {}
        for model in models:
            stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
            report["triton_statistics"][model] = {"inference": stats["inference_stats"], "executions": stats.get("execution_count"),
                                                  "inferences": stats.get("inference_count")}
    finally:
        server.stop()
        report["log_tail"] = (root / "tritonserver.log").read_text()[-3000:]
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'model':<22}{'conc':>5}{'bulk':>5}{'req/s':>10}{'texts/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'err':>5}")
    for r in report["load"]:
        print(f"{r['model']:<22}{r['concurrency']:>5}{r['bulk']:>5}{r['req_per_s']:>10}{r['texts_per_s']:>10}"
              f"{r['p50_ms']!s:>9}{r['p99_ms']!s:>9}{r['errors']:>5}")
    for model, values in report.get("fastpath_metrics", {}).items():
        if values["fastpath_batch_size_count"]:
            print(f"{model:<22} engine batches per execute {values['fastpath_batch_size_count'] / max(1.0, values['nv_inference_exec_count']):.2f}, "
                  f"padded/real tokens {values['fastpath_padded_tokens_total'] / max(1.0, values['fastpath_real_tokens_total']):.2f}")
    for model, stats in report.get("triton_statistics", {}).items():
        inference = stats["inference"]
        count = max(1, int(inference["success"].get("count", 0)))
        split = {key: round(int(inference[key].get("ns", 0)) / count / 1e3, 1) for key in ("queue", "compute_input", "compute_infer", "compute_output")}
        print(f"{model:<22} server-side us per request {split}; texts per execute "
              f"{int(stats['inferences'] or 0) / max(1, int(stats['executions'] or 0)):.2f}")
    return 0


def _one(module, text):
    tensor = module.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    return tensor


if __name__ == "__main__":
    sys.exit(main())
