"""text_embedding served by Triton 2.51 on one GPU, measured with perf_analyzer: FastPath side by side with
the models a user would write, in one server per run.

Runs on the device machine (docs/benchmarks/served_gpu_h200.md has the exact commands). Steps:
  1. a private model repository (``benchmarks/gpu/triton_gpu.py``'s layout: fp16 weights, one CUDA
     graph per (batch, length) bucket, N instances of each model):
       text_embedding_rt   FastPath with its GPU configuration: ``response_mode=return``, Triton's
                           dynamic batcher at 0 us hands each ``execute()`` what queued meanwhile,
                           and the call's texts run in the batches the cost model picks;
       text_embedding_prev the same configuration on another copy of FastPath's backend
                           (``--prev-backend``), for an A/B of two versions of the code in one run;
       text_embedding_gpu_prev  ``text_embedding_gpu`` (configs/gpu.pbtxt as shipped) on that copy;
       stack_pad_embedding Triton's dynamic batcher (200 us) + stack every text of the call, pad to
                           the longest, one graph-bucket call (``benchmarks/models``);
       naive_embedding     one graph replay per request, no dynamic batching;
       floor_embedding     no engine: reads TEXT, tokenizes every text of a call in one tokenizer
                           call and answers zeros, behind the same 0 us dynamic batcher;
  2. numerics through the server: the golden texts against their fp32 embeddings (cosine), and a
     text alone against the same text inside a batch;
  3. load from perf_analyzer (gRPC, real texts from ``--input-data`` JSON, one text or ``-b 32``
     texts per request) for each workload, model and concurrency; perf_analyzer's columns, plus the CPU each process
     group used (tritonserver, each model's stubs, perf_analyzer); with ``--rounds N`` each cell runs its models N times,
     the order reversed every other round, and each model's ratio to ``--baseline`` (req/s, same round) per round;
  4. optionally py-spy on one stub of each of --py-spy-models at the highest concurrency, and the raw in-process
     engine (tokenize + pad + graph) on the 32-text batches of the passages workload.

Workloads: ``short`` (pydoc sentences, ~12-72 tokens, one per request), ``passages`` (pydoc
topic text cut into 64-256-token chunks of mixed length; one per request, and ``passages32``: 32
per request) and ``mixed`` (every paragraph of the pydoc topics as written, one per request: one-line
paragraphs beside long passages in the proportion that documentation has them; :func:`fastpath.text.corpus.pydoc_paragraphs`). Writes JSON to ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_analyzer as pa  # noqa: E402  (benchmarks/perf_analyzer.py: input data, cells, CSV)
import stub_probes  # noqa: E402  (benchmarks/gpu: CPU accounting, py-spy, metrics)
import thread_cpu  # noqa: E402  (benchmarks/gpu: CPU per stub thread)
import timeline  # noqa: E402  (benchmarks/timeline.py: FastPath's timeline per cell)
import triton_gpu  # noqa: E402  (benchmarks/gpu: repository layout)
from text_workloads import WORKLOADS, passages, token_lengths  # noqa: E402  (benchmarks/gpu: the texts)


def _on_prev_backend(repository: Path, source: str, name: str, prev_backend: Path | None) -> Path:
    """A copy of model ``source`` named ``name`` whose model.py imports FastPath from ``prev_backend`` (A/B of two versions of the code)."""
    if prev_backend is None:
        raise SystemExit(f"{name} needs --prev-backend (a copy of another version's backend/)")
    target = repository / name
    shutil.copytree(repository / source, target, symlinks=True)
    (target / "1" / "model.py").unlink()
    code = (ROOT / "model_repository" / "text_embedding" / "1" / "model.py").read_text()
    (target / "1" / "model.py").write_text(f"import sys\nsys.path.insert(0, {str(prev_backend.resolve())!r})\n" + code)
    config = (target / "config.pbtxt").read_text().replace(f'name: "{source}"', f'name: "{name}"')
    (target / "config.pbtxt").write_text(config)
    return target


def build_repository(root: Path, version_dir: Path, models: list[str], *, instances: int, prev_backend: Path | None,
                     device: str = "cuda", precision: str = "fp16") -> Path:
    """The run's model repository: ``models`` (see the module docstring) with ``instances`` each."""
    repository = triton_gpu.make_repository(root, version_dir, device=device, precision=precision, instances=instances, delay_us=500)
    names = [m for m in models if m != "floor_embedding"]
    triton_gpu.add_variants(repository, version_dir, [m for m in names if m not in ("text_embedding_prev", "text_embedding_gpu_prev")],
                            device=device, precision=precision, instances=instances)
    if "text_embedding_prev" in models:
        target = _on_prev_backend(repository, "text_embedding", "text_embedding_prev", prev_backend)
        config = (target / "config.pbtxt").read_text()
        config += 'parameters { key: "response_mode" value: { string_value: "return" } }\n'
        config += "dynamic_batching { max_queue_delay_microseconds: 0 }\n"
        (target / "config.pbtxt").write_text(config)
    if "text_embedding_gpu_prev" in models:
        built = (repository / "text_embedding_gpu").is_dir()
        if not built:
            triton_gpu.add_variants(repository, version_dir, ["text_embedding_gpu"], device=device, precision=precision, instances=instances)
        _on_prev_backend(repository, "text_embedding_gpu", "text_embedding_gpu_prev", prev_backend)
        if not built:
            shutil.rmtree(repository / "text_embedding_gpu")
    if "floor_embedding" in models:
        triton_gpu.add_variants(repository, version_dir, ["floor_embedding"], device=device, precision=precision, instances=instances)
        config = repository / "floor_embedding" / "config.pbtxt"
        config.write_text(config.read_text() + "dynamic_batching { max_queue_delay_microseconds: 0 }\n")
    return repository


def run_cell(analyzer: pa.PerfAnalyzer, server, model: str, workload: str, data: Path, concurrency: int,
             measurement_ms: int, out_dir: Path, tag: str = "") -> dict:
    """A cell (:func:`perf_analyzer.stable_cell` over gRPC) with the CPU its process groups used (cores, and
    microseconds per request)."""
    account = stub_probes.CpuAccount(server.pid)
    threads = thread_cpu.ThreadCpu([pid for pid, name in account.stubs.items() if name == model])
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    load = pa.Load(model=model, url=server.grpc_url, data=data, batch=WORKLOADS[workload], concurrency=concurrency)
    cell = pa.stable_cell(analyzer, load, measurement_ms=measurement_ms, csv_path=out_dir / f"{model}_{workload}_c{concurrency}{tag}.csv")
    wall_s = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_s = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    # perf_analyzer's rate holds over its whole run (warm-up and trials), so CPU per request = cores / rate
    cpu = account.finish(max(1, int(cell["req_per_s"] * wall_s)), client_s, wall_s)
    cell.update(model=model, workload=workload, concurrency=concurrency, cpu=cpu, wall_s=round(wall_s, 1),
                stub_threads=threads.finish(wall_s, stub_probes.py_spy_binary()))  # cores per thread group of the model's stubs
    return cell


def raw_engine(version_dir: Path, texts: list[str], bulk: int, device: str = "cuda") -> dict:
    """The raw in-process engine on the passages32 requests' batches: tokenize + pad to the length
    bucket + ``TorchEngine.infer`` (H2D, graph replay, D2H), one batch after another, >= 3 s."""
    from fastpath.engines.torch import TorchEngine
    from fastpath.models.text_embedding.config import TextEmbeddingConfig
    from fastpath.models.text_embedding.pipeline import engine_options, padded_length
    from fastpath.text import TextTokenizer

    config = TextEmbeddingConfig(runtime="torch", precision="fp16", device=device, max_seq_length=256,
                                 length_buckets_tokens=(16, 32, 64, 128, 256))
    tokenizer = TextTokenizer(version_dir / "tokenizer.json", max_seq_length=256)
    options = engine_options(config)
    engine = TorchEngine(str(version_dir / "model.fp16.safetensors"), device=device, precision="fp16",
                         batch_sizes=options["batch_sizes"], lengths=options["lengths"])
    batches = [texts[k : k + bulk] for k in range(0, len(texts) - bulk + 1, bulk)]

    def one(batch: list[str]) -> None:
        encodings = tokenizer.encode(batch)
        length = padded_length(max(len(e.ids) for e in encodings), config.length_buckets_tokens, 256)
        engine.infer(tokenizer.pad(encodings, length).feeds())

    for batch in batches[:8]:
        one(batch)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < 3.0:
        for batch in batches:
            one(batch)
            done += len(batch)
    elapsed = time.perf_counter() - started
    engine.close()
    return {"texts_per_s": round(done / elapsed, 1), "batch": bulk, "batches": len(batches), "seconds": round(elapsed, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version-dir", type=Path, default=ROOT / "model_repository" / "text_embedding" / "1")
    parser.add_argument("--instances", type=int, default=6)
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the same steps slowly, as a smoke test")
    parser.add_argument("--precision", default="fp16", help="fp16 (the GPU configuration); fp32 for a CPU smoke test")
    parser.add_argument("--models", default="text_embedding_rt,stack_pad_embedding,naive_embedding,floor_embedding")
    parser.add_argument("--prev-backend", type=Path, default=None)
    parser.add_argument("--cells", default="short:1,64,256;passages:64;passages32:32;mixed:1,64,256,512",
                        help="workload:concurrencies;... (workloads: short, passages, passages32, mixed)")
    parser.add_argument("--skip", default="naive_embedding@short:256,512;naive_embedding@passages32",
                        help="cells not to run: model@workload[:concurrencies];...")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1, help="each cell's models this many times, reversed every other round")
    parser.add_argument("--baseline", default="stack_pad_embedding", help="the model each ratio divides by (req/s, same round)")
    parser.add_argument("--py-spy", type=float, default=0.0, dest="py_spy", help="seconds of py-spy on one stub of each --py-spy-models")
    parser.add_argument("--py-spy-native", action="store_true",
                        help="py-spy with --native: the C/C++ frames under each Python frame (it pauses the stub per sample)")
    parser.add_argument("--py-spy-gil", action="store_true", help="py-spy with --gil: only the thread holding the GIL")
    parser.add_argument("--py-spy-models", default="", help="MODEL,...: whose stub py-spy samples, one cell each (default: the first of --models)")
    parser.add_argument("--timeline-cells", default="", help="MODEL:WORKLOAD:C;...: FastPath's timeline of these cells "
                        "(per phase: busy time, threads, overlap with the engine; benchmarks/timeline.py)")
    parser.add_argument("--raw", action="store_true", help="the raw in-process engine on the passages32 batches")
    parser.add_argument("--out", type=Path, default=Path("served_gpu.json"))
    parser.add_argument("--csv-dir", type=Path, default=None, help="where perf_analyzer's CSV files go (default: beside --out)")
    args = parser.parse_args()
    from fastpath.server.process import ServerOptions, TritonServer
    from fastpath.text.corpus import pydoc_paragraphs, pydoc_sentences
    from tests.conftest import free_ports

    analyzer = pa.find()  # PERF_ANALYZER and FASTPATH_PA_LIBS on the GPU machine (served_gpu.sh)
    models = args.models.split(",")
    root = Path(tempfile.mkdtemp(prefix="served-gpu-"))
    out_dir = args.csv_dir or args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    sentences = pydoc_sentences()
    random.Random(0).shuffle(sentences)
    chunks = passages(args.version_dir / "tokenizer.json")
    random.Random(1).shuffle(chunks)
    data = {"short": pa.write_input_data(root / "short.json", pa.text_entries(sentences)),
            "passages": pa.write_input_data(root / "passages.json", pa.text_entries(chunks))}
    data["passages32"] = data["passages"]
    mixed = pydoc_paragraphs()
    random.Random(2).shuffle(mixed)
    data["mixed"] = pa.write_input_data(root / "mixed.json", pa.text_entries(mixed))
    repository = build_repository(root, args.version_dir, models, instances=args.instances, prev_backend=args.prev_backend,
                                  device=args.device, precision=args.precision)
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                        host="127.0.0.1", exit_timeout_s=60, models=tuple(dict.fromkeys(["fastpath_admin", *models]))),
                          log_path=root / "tritonserver.log")
    report: dict = {"command": " ".join(sys.argv), "instances": args.instances, "models": models,
                    "corpus": {"short_texts": len(sentences), "passages": len(chunks),
                               "mixed": token_lengths(args.version_dir / "tokenizer.json", mixed)}}
    skip = set()
    for item in filter(None, args.skip.split(";")):
        model, _, rest = item.partition("@")
        workload, _, levels = rest.partition(":")
        skip |= {(model, workload, c) for c in (levels.split(",") if levels else ["*"])}
    timelines = timeline.CellTimelines(args.timeline_cells, root / "timeline")
    timelines.start()
    started = time.monotonic()
    server.start()
    try:
        try:
            server.wait_ready(timeout_s=500)
        except Exception:  # the log goes with the temporary directory: show why the models did not load
            print("".join(line for line in (root / "tritonserver.log").read_text().splitlines(True) if line.startswith("E")))
            raise
        report["load_s"] = round(time.monotonic() - started, 1)
        report["numerics"] = {m: numerics(server.grpc_url, args.version_dir, m) for m in models if m.startswith("text_embedding")}
        print("load_s", report["load_s"], "numerics", report["numerics"], flush=True)
        rows = []
        for spec in args.cells.split(";"):
            workload, levels = spec.split(":")
            for concurrency, round_, model in cell_order(models, [int(c) for c in levels.split(",")], args.rounds):
                if {(model, workload, "*"), (model, workload, str(concurrency))} & skip:
                    continue
                cell_t0 = time.time()
                try:
                    rows.append(run_cell(analyzer, server, model, workload, data[workload], concurrency, args.measurement_ms, out_dir,
                                         tag=f"_r{round_}" if args.rounds > 1 else ""))
                    rows[-1]["round"] = round_
                except (pa.PerfAnalyzerError, subprocess.TimeoutExpired) as exc:  # reported; the other cells still run
                    report.setdefault("failed_cells", []).append({"model": model, "workload": workload,
                                                                  "concurrency": concurrency, "error": str(exc)[-800:]})
                    print("FAILED", report["failed_cells"][-1], flush=True)
                    report["failed_cells"][-1].update(stub_probes.failure_state(metrics_port, model, root / "tritonserver.log"))
                    print("    server then:", report["failed_cells"][-1], flush=True)
                    args.out.write_text(json.dumps(report, indent=2) + "\n")
                    continue
                timelines.ran(f"{model}:{workload}:{concurrency}", cell_t0, time.time())
                print(_line(rows[-1]), "\n    stub cores per thread group:", rows[-1]["stub_threads"]["groups"], flush=True)
                report["load"] = rows
                args.out.write_text(json.dumps(report, indent=2) + "\n")  # what ran so far survives a time limit
        report["load"] = rows
        report["ratios"] = cell_ratios(rows, args.baseline)
        if args.py_spy:
            top = max(int(c) for c in args.cells.split(";")[0].split(":")[1].split(","))
            report["py_spy"] = {model: spy_cell(analyzer, server, model, data["short"], top, args.py_spy, root / model,
                                                  native=args.py_spy_native, gil=args.py_spy_gil, keep=out_dir)
                                for model in (args.py_spy_models.split(",") if args.py_spy_models else models[:1])}
        report["triton_statistics"] = statistics(server.grpc_url, models)
        report["fastpath_metrics"] = fastpath_metrics(metrics_port, models)
    finally:
        server.stop()
        log = (root / "tritonserver.log").read_text()
        report["stub_crashes_in_log"] = sum(log.count(marker) for marker in ("Segmentation fault", "Fatal Python error"))
        report["log_tail"] = log[-2000:]
        if timelines.cells:
            report["timelines"] = timelines.summaries(out_dir)
    if args.raw:
        report["raw_engine"] = raw_engine(args.version_dir, chunks, 32, args.device)
        for row in report["load"]:
            if row["workload"] == "passages32":
                row["vs_raw_engine"] = round(row["texts_per_s"] / report["raw_engine"]["texts_per_s"], 3)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    summary(report)
    return 0


def numerics(url: str, version_dir: Path, model: str) -> dict:
    """Golden texts vs their fp32 embeddings (min cosine), and "hello world" alone vs inside a batch (max abs)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)

    def embed(texts: list[str]) -> np.ndarray:
        tensor = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
        return client.infer(model, [tensor]).as_numpy("EMBEDDING")

    with np.load(version_dir / "golden.npz") as golden:
        texts, expected = [str(t) for t in golden["texts"]], golden["embeddings"]
    got = embed(texts)
    cosine = (got * expected).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    batch = embed(texts + ["hello world", "word " * 400])
    return {"golden_min_cosine_to_fp32": round(float(cosine.min()), 6), "golden_texts": len(texts),
            "alone_vs_in_batch_max_abs": float(np.abs(embed(["hello world"])[0] - batch[len(texts)]).max())}


def fastpath_metrics(port: int, models: list[str]) -> dict:
    """Per FastPath model, over the whole run: engine calls per ``execute()`` and padded over real tokens."""
    result = {}
    for model in models:
        totals = stub_probes.model_metrics(port, model)
        calls = totals.get("fastpath_batch_size_count", 0.0)
        if calls:
            result[model] = {"engine_calls_per_execute": round(calls / max(1.0, totals.get("nv_inference_exec_count", 0.0)), 3),
                             "padded_over_real_tokens": round(totals.get("fastpath_padded_tokens_total", 0.0)
                                                              / max(1.0, totals.get("fastpath_real_tokens_total", 0.0)), 3)}
    return result


def statistics(url: str, models: list[str]) -> dict:
    """Triton's per-model statistics over the whole run: requests per execute() and the server-side split."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    result = {}
    for model in models:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        result[model] = {"executions": int(stats.get("execution_count", 0)), "inferences": int(stats.get("inference_count", 0)),
                         "requests": int(stats["inference_stats"]["success"].get("count", 0))}
    return result


def spy_cell(analyzer: pa.PerfAnalyzer, server, model: str, data: Path, concurrency: int, seconds: float, root: Path,
             *, native: bool = False, gil: bool = False, keep: Path | None = None) -> dict:
    """py-spy on one stub of ``model`` while perf_analyzer loads it (a cell of its own, not measured); py-spy's own
    last lines of stderr (``stderr``) come with the summary when it recorded no sample. Its collapsed stacks are
    copied to ``keep``/py_spy_MODEL.txt."""
    root.mkdir(parents=True, exist_ok=True)
    spying = stub_probes.start_py_spy(model, seconds, root / "py_spy.txt", native=native, gil=gil)
    if spying is None:
        return {}
    try:
        pa.stable_cell(analyzer, pa.Load(model=model, url=server.grpc_url, data=data, concurrency=concurrency),
                       measurement_ms=int(seconds * 1000 / 3), csv_path=root / "spy.csv")
    finally:
        spying.wait(timeout=120)
    summary = stub_probes.summarize_py_spy(root / "py_spy.txt", top=30)
    if keep is not None and (root / "py_spy.txt").exists():
        shutil.copy(root / "py_spy.txt", keep / f"py_spy_{model}.txt")
    if not summary.get("samples"):
        errors = stub_probes.py_spy_stderr(root / "py_spy.txt")
        summary["stderr"] = errors.read_text(errors="replace").splitlines()[-12:] if errors.exists() else []
    return summary


def cell_order(models: list[str], concurrencies: list[int], rounds: int) -> list[tuple[int, int, str]]:
    """(concurrency, round, model) in the order a workload's cells run: per concurrency, ``rounds`` rounds of every model,
    the models in the given order in even rounds and reversed in odd ones (so each leads as often as it trails)."""
    return [(concurrency, round_, model) for concurrency in concurrencies for round_ in range(rounds)
            for model in (models if round_ % 2 == 0 else models[::-1])]


def cell_ratios(rows: list[dict], baseline: str) -> dict[str, dict[str, dict]]:
    """``{"workload:c": {model: {"per_round": [...], "median": x}}}``: each model's req/s over ``baseline``'s in the same
    round of the same cell (rounds where either is missing are left out); empty where ``baseline`` never ran."""
    cells: dict[tuple[str, int, int], dict[str, float]] = {}
    for row in rows:
        cells.setdefault((row["workload"], row["concurrency"], row.get("round", 0)), {})[row["model"]] = row["req_per_s"]
    ratios: dict[str, dict[str, dict]] = {}
    for (workload, concurrency, _), rates in sorted(cells.items()):
        if not rates.get(baseline):
            continue
        for model, rate in rates.items():
            if model != baseline:
                entry = ratios.setdefault(f"{workload}:{concurrency}", {}).setdefault(model, {"per_round": []})
                entry["per_round"].append(round(rate / rates[baseline], 3))
                entry["median"] = round(float(np.median(entry["per_round"])), 3)
    return ratios


def _line(r: dict) -> str:
    cpu = r["cpu"]["cpu_us_per_request"]
    stubs = cpu.get(f"stubs:{r['model']}", sum(v for k, v in cpu.items() if k.startswith("stubs:")))  # the model's own stubs
    return (f"{r['model']:<22}{r['workload']:<11}c={r['concurrency']:<4}{r['req_per_s']:>9.0f} req/s {r['texts_per_s']:>9.0f} texts/s "
            f"p50 {r['p50_us'] / 1e3:6.2f} p99 {r['p99_us'] / 1e3:6.2f} ms  queue {r['server_queue_us']:6.0f} infer "
            f"{r['server_compute_infer_us']:6.0f} us  cpu us/req: stubs {stubs:5.0f} server {cpu['tritonserver']:4.0f} "
            f"pa {cpu['client']:4.0f}  busy {r['cpu']['machine_busy_pct']}%{' (2nd try)' if r['unstable_first_try'] else ''}")


def summary(report: dict) -> None:
    print(f"\nload {report.get('load_s')} s; numerics {report.get('numerics')}; stub crashes {report['stub_crashes_in_log']}; "
          f"failed cells {len(report.get('failed_cells', []))}")
    for row in report.get("load", []):
        print(_line(row) + (f"  vs raw {row['vs_raw_engine']}" if "vs_raw_engine" in row else ""))
    if "raw_engine" in report:
        print("raw engine (tokenize + graph), passages32 batches:", report["raw_engine"])
    for model, spied in (report.get("py_spy") or {}).items():
        if spied:
            print(f"py-spy {model}: {spied['samples']} samples" + "".join(f"\n  py-spy: {line}" for line in spied.get("stderr", [])))
            print("  self %:", "; ".join(f"{n} {p}" for n, p in spied["self_pct"][:22]))
            print("  inclusive %:", "; ".join(f"{n} {p}" for n, p in spied["inclusive_pct"][:22]))
    for cell, models in report.get("ratios", {}).items():
        print(f"  {cell:<14}" + "; ".join(f"{model} / baseline {entry['median']} (rounds {entry['per_round']})" for model, entry in models.items()))
    for model, stats in report.get("triton_statistics", {}).items():
        print(f"  {model:<22} requests per execute {stats['requests'] / max(1, stats['executions']):.2f}",
              report.get("fastpath_metrics", {}).get(model, ""))


if __name__ == "__main__":
    sys.exit(main())
