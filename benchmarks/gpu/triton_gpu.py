"""Design A/Bs of text_embedding served by Triton 2.51 on the GPU, with a Python gRPC load generator.

Served throughput figures come from ``benchmarks/gpu/served_gpu.py`` (perf_analyzer), which also uses this
module's model-repository layout (:func:`make_repository`, :func:`add_variants`). The load generator is
``grpc_load.py``; CPU accounting and py-spy live in ``stub_probes.py`` (both beside this file).

Runs on the device machine (see docs/benchmarks/triton_gpu_h200.md for the exact commands); also on a
CPU machine as a smoke test (``--device cpu``). Steps:
  1. a private model repository: text_embedding with runtime=torch, the given precision and device,
     one CUDA graph per (batch, length) bucket, N instances; fastpath_admin;
  2. tritonserver from the nvidia-pytriton wheel (``FASTPATH_TRITON_DIR``) with this interpreter
     first on PATH (numpy 1.x for the stub);
  3. numerics: served embeddings vs the engine in-process (cosine), and a text's embedding independent of its batch neighbours;
  4. load: a multi-process gRPC load generator (one text per request, real sentences) at each
     concurrency, and bulk requests of 32 texts; req/s, p50, p99; Triton's server-side split.
     With ``--models`` the same server also serves, side by side in the same run:
       text_embedding_tb  FastPath with ``dynamic_batching { max_queue_delay_microseconds: 0 }``: Triton
                          hands ``execute()`` every request queued meanwhile; answers still go one by
                          one through response senders;
       text_embedding_rt  the same with ``response_mode=return``: ``execute()`` returns its requests'
                          responses, one stub round trip per call (docs/design/scheduler.md);
       text_embedding_noinline
                          text_embedding with ``inline_when_idle=false``: the scheduler threads answer
                          every request, also a lone one (A/B of the inline execute);
       text_embedding_gpu the product as shipped: model_repository/text_embedding/configs/gpu.pbtxt itself, only
                          its name and instance count changed (KIND_GPU, fp16: not for --device cpu);
       text_embedding_gpu_nometrics / _blocking
                          the same with FastPath's metrics off (``metrics false``: no histogram round trips
                          from the stub) / with ``cuda_sync blocking``, for A/Bs of the shipped config;
       text_embedding_rt_blocking / _tokpar / _tp<N> / _d<N> / _old
                          text_embedding_rt with ``cuda_sync=blocking`` / ``tokenizer_parallelism=true``
                          / the same on a pool of N threads / Triton's batcher waiting up to N us / the latter, for A/B runs;
       naive_embedding    the "one CUDA graph replay per request" baseline (benchmarks/models);
       echo_embedding / echo_batched_embedding
                          no engine: decode, tokenize and answer zeros, one request per execute() /
                          behind Triton's dynamic batcher (200 us): the python backend's own ceiling;
       stack_pad_embedding the "Triton dynamic batcher (200 us) + stacking + graph buckets" baseline.
Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from config_text import with_parameter  # noqa: E402  (benchmarks/config_text.py)
from grpc_load import load  # noqa: E402  (beside this file)


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
    config = re.sub(r"count: \d+", f"count: {instances}", config)
    # FastPath's own parameters and Triton's batcher are set below: text_embedding here is sender mode
    # without dynamic batching (the variants add it), whatever the shipped CPU config uses.
    lines = [line for line in config.splitlines() if not line.startswith(("parameters {", "dynamic_batching"))]
    params = {"runtime": "torch", "precision": precision, "device": device, "artifact": "model.fp16.safetensors",
              "max_seq_length": "256", "length_buckets_tokens": "16,32,64,128,256", "batch_buckets": "1,2,4,8,16,32,64",
              "max_queue_delay_us": str(delay_us), "max_queue_texts": "8192"}
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    (model / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return repository


def _pin_backend(code: str) -> str:
    """Make a model.py import ``fastpath`` from this tree's backend/ (not whatever the interpreter has installed)."""
    return f"import sys\nsys.path.insert(0, {str(ROOT / 'backend')!r})\n" + code


# the shipped GPU configuration with one FastPath parameter changed (see the module docstring)
GPU_CONFIG_VARIANTS = {
    "text_embedding_gpu_nometrics": {"metrics": "false"},
    "text_embedding_gpu_blocking": {"cuda_sync": "blocking"},
}


def add_variants(repository: Path, version_dir: Path, names: list[str], *, device: str, precision: str, instances: int) -> None:
    """Add the side-by-side models ``names`` (see the module docstring) to ``repository``."""
    base = repository / "text_embedding"
    engine = {"runtime": "torch", "precision": precision, "device": device, "artifact": "model.fp16.safetensors",
              "max_seq_length": "256", "length_buckets_tokens": "16,32,64,128,256"}
    for name in names:
        target = repository / name
        if name == "text_embedding_gpu" or name in GPU_CONFIG_VARIANTS:  # the shipped GPU configuration as it ships
            shutil.copytree(base, target, symlinks=True)
            config = (ROOT / "model_repository" / "text_embedding" / "configs" / "gpu.pbtxt").read_text()
            config = re.sub(r"count: \d+", f"count: {instances}", config.replace('name: "text_embedding"', f'name: "{name}"'))
            for key, value in GPU_CONFIG_VARIANTS.get(name, {}).items():
                config = with_parameter(config, key, value)
            if device == "cpu":  # the same configuration on CPU instances (a smoke test, or Python-path A/Bs on a CPU machine)
                config = with_parameter(config.replace("kind: KIND_GPU", "kind: KIND_CPU"), "precision", precision)
            (target / "config.pbtxt").write_text(config)
            continue
        if name in ("text_embedding_tb", "text_embedding_rt", "text_embedding_noinline") or name.startswith("text_embedding_rt_"):
            shutil.copytree(base, target, symlinks=True)
            config = (base / "config.pbtxt").read_text().replace('name: "text_embedding"', f'name: "{name}"')
            if name.startswith("text_embedding_rt"):
                config += 'parameters { key: "response_mode" value: { string_value: "return" } }\n'
            if name == "text_embedding_noinline":  # sender mode, the scheduler threads answer every request
                config += 'parameters { key: "inline_when_idle" value: { string_value: "false" } }\n'
            if name.endswith("_blocking"):  # blocking-sync CUDA event instead of the default busy-wait
                config += 'parameters { key: "cuda_sync" value: { string_value: "blocking" } }\n'
            if name.endswith("_tokpar") or name.endswith("_old"):  # tokenizer Rayon parallelism on
                config += 'parameters { key: "tokenizer_parallelism" value: { string_value: "true" } }\n'
            threads = re.search(r"_tp(\d+)$", name)
            if threads:  # tokenizer Rayon parallelism on a pool of that many threads
                config += 'parameters { key: "tokenizer_parallelism" value: { string_value: "true" } }\n'
                config += f'parameters {{ key: "tokenizer_threads" value: {{ string_value: "{threads.group(1)}" }} }}\n'
            if name != "text_embedding_noinline":  # the base text_embedding here runs without Triton's batcher
                delay = re.search(r"_d(\d+)$", name)  # _d<N>: Triton's batcher waits up to N us, not 0
                config += f"dynamic_batching {{ max_queue_delay_microseconds: {delay.group(1) if delay else 0} }}\n"
            (target / "config.pbtxt").write_text(config)
            continue
        batched_echo = name == "echo_batched_embedding"  # echo_embedding behind Triton's dynamic batcher
        source = ROOT / "benchmarks" / "models" / ("echo_embedding" if batched_echo else name)
        (target / "1").mkdir(parents=True)
        for item in ("model.fp16.safetensors", "tokenizer.json"):
            (target / "1" / item).symlink_to((version_dir / item).resolve())
        code = (source / "1" / "model.py").read_text().replace(
            "Path(__file__).resolve().parents[2]", repr(str(ROOT / "benchmarks" / "models")))
        (target / "1" / "model.py").write_text(_pin_backend(code))
        config = (source / "config.pbtxt").read_text().replace("count: 1", f"count: {instances}")
        config = config.replace("max_queue_delay_microseconds: 2000", "max_queue_delay_microseconds: 200")
        config += "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in engine.items())
        if batched_echo:
            config = config.replace('name: "echo_embedding"', f'name: "{name}"')
            config += "dynamic_batching { max_queue_delay_microseconds: 200 }\n"
        (target / "config.pbtxt").write_text(config)


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
    parser.add_argument("--bulk", type=int, default=32, help="texts per request of the bulk cell (at concurrency 32); 0: no bulk cell")
    parser.add_argument("--profile", action="store_true",
                        help="FASTPATH_PHASE_PROFILE in the stubs: seconds per phase of the serving path, printed per model")
    parser.add_argument("--raw", action="store_true",
                        help="after the server stops: the raw engine's graph throughput on the bulk requests' batches (in-process)")
    parser.add_argument("--py-spy", type=float, default=0.0, dest="py_spy",
                        help="seconds of py-spy sampling of one stub per model in the highest-concurrency cell (0: off)")
    parser.add_argument("--clients", default="tritonclient",
                        help="comma list of load generators to run each cell with: tritonclient, grpc-raw (see _worker)")
    parser.add_argument("--out", type=Path, default=Path("triton_gpu.json"))
    args = parser.parse_args()
    from fastpath.server.process import ServerOptions, TritonServer
    from fastpath.text.corpus import pydoc_sentences
    from tests.conftest import free_ports

    texts = pydoc_sentences()
    root = Path(tempfile.mkdtemp(prefix="triton-gpu-"))
    if args.profile:
        os.environ["FASTPATH_PHASE_PROFILE"] = str(root / "phases")  # tritonserver and its stubs inherit it
    repository = make_repository(root, args.version_dir, device=args.device, precision=args.precision,
                                 instances=args.instances, delay_us=args.delay_us)
    models = args.models.split(",")
    add_variants(repository, args.version_dir, [m for m in models if m != "text_embedding"], device=args.device,
                 precision=args.precision, instances=args.instances)
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port,
                                        metrics_port=metrics_port, host="127.0.0.1", exit_timeout_s=60,
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
            levels = [int(c) for c in args.concurrency.split(",")]
            for client_kind in args.clients.split(","):
                for concurrency in levels:
                    spy = (args.py_spy, root / f"py_spy_{model}.txt") if args.py_spy and concurrency == max(levels) else None
                    rows.append(load(server.grpc_url, texts, concurrency, args.duration_s, processes=args.processes, model=model,
                                     server_pid=server.pid, spy=spy, client_kind=client_kind))
                    print(rows[-1], flush=True)
                if args.bulk:
                    rows.append(load(server.grpc_url, texts, 32, args.duration_s, bulk=args.bulk, processes=args.processes, model=model,
                                     server_pid=server.pid, client_kind=client_kind))
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
        log = (root / "tritonserver.log").read_text()
        report["log_tail"] = log[-3000:]
        report["stub_crashes_in_log"] = sum(log.count(marker) for marker in ("Segmentation fault", "Fatal Python error"))
        report["unloaded_cleanly"] = "Exit timeout expired" not in log
    if args.profile:
        report["phases"] = phase_report(root / "phases")
    if args.raw and args.bulk:
        report["raw_graph"] = raw_graph_throughput(args.version_dir, texts, args.bulk, args.precision, args.device)
        for row in report["load"]:
            if row["bulk"] == args.bulk:
                row["vs_raw_graph"] = round(row["texts_per_s"] / report["raw_graph"]["texts_per_s"], 3)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'model':<22}{'client':<13}{'conc':>5}{'bulk':>5}{'req/s':>10}{'texts/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'err':>5}{'vs raw':>8}")
    for r in report["load"]:
        print(f"{r['model']:<22}{r['client']:<13}{r['concurrency']:>5}{r['bulk']:>5}{r['req_per_s']:>10}{r['texts_per_s']:>10}"
              f"{r['p50_ms']!s:>9}{r['p99_ms']!s:>9}{r['errors']:>5}{r.get('vs_raw_graph', ''):>8}")
    print("CPU cores used per process group during each cell (machine busy %); CPU microseconds per request:")
    for r in report["load"]:
        cpu = r["cpu"]
        print(f"  {r['model']:<22}{r['client']:<13}c={r['concurrency']:<4} bulk={r['bulk']:<3} busy {cpu['machine_busy_pct']:>5}% of {cpu['cpus']}: "
              f"{cpu['cores_used']}  us/request {cpu['cpu_us_per_request']}")
    for r in report["load"]:
        if "py_spy" in r:
            spied = r["py_spy"]
            print(f"py-spy, one stub of {r['model']} at c={r['concurrency']}: {spied['samples']} active samples")
            print("    self %:     ", "; ".join(f"{name} {pct}" for name, pct in spied["self_pct"][:18]))
            print("    inclusive %:", "; ".join(f"{name} {pct}" for name, pct in spied["inclusive_pct"][:18]))
    if "raw_graph" in report:
        print("raw engine graph throughput (bulk batches, in-process):", report["raw_graph"])
    print("stub crashes in Triton's log (segfault / fatal Python error):", report["stub_crashes_in_log"],
          "; every model unloaded within the exit timeout:", report["unloaded_cleanly"])
    for model, phases in report.get("phases", {}).items():
        print(f"{model}: microseconds per request by phase (all cells of this run pooled)")
        for phase, value in phases.items():
            if phase.startswith("counter:"):
                print(f"    {phase:<40} total {value['count']:>9}, per request {value['us_per_request']:.4f}")
            else:
                print(f"    {phase:<40}{value['us_per_request']:>10.1f} us/request   {value['count']:>9} units")
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


def phase_report(directory: Path) -> dict:
    """Per model: each phase's microseconds per served request, pooled over its instances' profile files.

    A file is ``<model>_<group>_<instance>.json`` (fastpath.profiling); requests are the count of
    ``execute.total``.
    """
    import re

    pooled: dict[str, dict[str, dict[str, float]]] = {}
    counters: dict[str, dict[str, float]] = {}
    for path in sorted(directory.glob("*.json")) if directory.exists() else []:
        model = re.sub(r"_\d+_\d+$", "", path.stem)
        data = json.loads(path.read_text())
        for name, value in data.get("counters", {}).items():
            counters.setdefault(model, {})[name] = counters.get(model, {}).get(name, 0.0) + value
        for phase, value in data["phases"].items():
            cell = pooled.setdefault(model, {}).setdefault(phase, {"seconds": 0.0, "count": 0})
            cell["seconds"] += value["seconds"]
            cell["count"] += value["count"]
    report = {}
    for model, phases in pooled.items():
        requests = max(1, phases.get("execute.total", {}).get("count", 0))
        report[model] = {phase: {"us_per_request": round(v["seconds"] / requests * 1e6, 2), "count": v["count"],
                                 "us_per_unit": round(v["seconds"] / max(1, v["count"]) * 1e6, 2)}
                         for phase, v in phases.items()}
        for name, value in counters.get(model, {}).items():  # steady-state allocations etc., per served request
            report[model][f"counter:{name}"] = {"us_per_request": value / requests, "count": int(value), "us_per_unit": 0.0}
    return report


def raw_graph_throughput(version_dir: Path, texts: list[str], bulk: int, precision: str, device: str) -> dict:
    """The raw engine's graph throughput on the bulk requests' batches: texts/s, one engine, in-process.

    Batches are ``bulk`` consecutive corpus texts (what one bulk request carries), tokenized and
    padded to the length bucket of their longest text beforehand; the timed loop is
    ``TorchEngine.infer`` alone (host-to-device copy, graph replay, device-to-host copy), one
    batch after another on one stream, for at least 3 s.
    """
    from fastpath.engines.torch import TorchEngine
    from fastpath.models.text_embedding.config import TextEmbeddingConfig
    from fastpath.models.text_embedding.pipeline import engine_options
    from fastpath.text import TextTokenizer

    config = TextEmbeddingConfig(runtime="torch", precision=precision, device=device, max_seq_length=256,
                                 length_buckets_tokens=(16, 32, 64, 128, 256))
    tokenizer = TextTokenizer(version_dir / "tokenizer.json", max_seq_length=config.max_seq_length)
    options = engine_options(config)
    engine = TorchEngine(str(version_dir / "model.fp16.safetensors"), device=options["device"], precision=precision,
                         batch_sizes=options["batch_sizes"], lengths=options["lengths"])
    batches = []
    for start in range(0, min(len(texts), 64 * bulk), bulk):
        encodings = tokenizer.encode(texts[start : start + bulk])
        longest = max(len(e.ids) for e in encodings)
        length = next((b for b in options["lengths"] if b >= longest), longest)
        batches.append(tokenizer.pad(encodings, length).feeds())
    for feeds in batches[:8]:
        engine.infer(feeds)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < 3.0:
        for feeds in batches:
            engine.infer(feeds)
            done += feeds["input_ids"].shape[0]
    elapsed = time.perf_counter() - started
    engine.close()
    return {"texts_per_s": round(done / elapsed, 1), "batch": bulk, "batches": len(batches), "seconds": round(elapsed, 2)}


def _one(module, text):
    tensor = module.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    return tensor


if __name__ == "__main__":
    sys.exit(main())
