"""H200 benchmark of the torch runtime: numerics, eager vs CUDA-graph latency, FP16/FP8 vs FP32.

Two steps, one script:

    # here (dev machine): the bundle that travels (weights are fp16 safetensors: 45 MB)
    .venv/bin/python benchmarks/gpu/engines_bench.py prepare --bundle .carry/engines
    # on the GPU machine (device tool, carry .carry): numerics, timings, tests/gpu, table
    PYTHONPATH=backend:. PYTHONUNBUFFERED=1 python3 benchmarks/gpu/engines_bench.py run --bundle .carry/engines --out "$OUT"

``prepare`` writes ``model.fp16.safetensors`` (the version-1 torch artifact), ``tokenizer.json``
and ``golden.npz``: real sentences of the evaluation split (padded ids) with their fp32
embeddings from ONNX Runtime on the CPU (the true fp32 model), and full-length token rows of real
text for the timed batches. ``run`` compares each GPU variant with those fp32 embeddings, compares
graph replay with eager on the same engine, then times, side by side in one process:

- ``eager``: :meth:`TorchEngine.infer_eager` (host arrays in, host array out: H2D, forward, D2H);
- ``graph``: :meth:`TorchEngine.infer` (stage into pinned buffers, one H2D copy, replay, D2H);
- ``replay``: the captured graph alone, CUDA events around ``replay()`` (device time);
- the same ``graph`` path in FP32 and FP8, and transformers' ``BertModel`` eager/graph as the
  reference baseline when ``transformers`` imports.

Latency is the median over repeats after warm-up (wall clock after a synchronize for host-side
paths). Prints a table last; writes ``engines_bench.json`` and ``engines_bench.log`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LENGTHS = (32, 128)
ISSUE_GRAPH_MS = {(1, 32): 0.30, (64, 32): 0.62, (64, 128): 1.10, (256, 128): 3.66}  # reference figures: transformers fp16 graph
ISSUE_EAGER_MS = 4.8
log = logging.getLogger("engines_bench")


def prepare(bundle: Path, sentences: int, version: Path) -> None:
    """Write the bundle (run on the dev machine, where the fp32 version ``version`` was built)."""
    import shutil

    from fastpath.artifacts.quantize import text_batches
    from fastpath.artifacts.torch_weights import evaluation_texts
    from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
    from fastpath.text import TextTokenizer

    bundle.mkdir(parents=True, exist_ok=True)
    for name in ("model.fp16.safetensors", "tokenizer.json"):
        shutil.copyfile(version / name, bundle / name)
    tokenizer = TextTokenizer(version / "tokenizer.json", max_seq_length=256)
    texts = evaluation_texts(sentences)
    (batch,) = text_batches(texts, tokenizer, len(texts))
    with OnnxRuntimeEngine(str(version / "model.onnx")) as engine:
        reference = engine.infer(batch)["embedding"]
    long_ids = [i for e in tokenizer.encode(evaluation_texts(2000)) for i in e.ids[1:-1]]
    rows = {}
    for length in LENGTHS:
        body = length - 2
        rows[length] = np.array([[101, *long_ids[r * body : (r + 1) * body], 102] for r in range(max(BATCHES))], dtype=np.int64)
    np.savez(bundle / "golden.npz", texts=np.array(texts), input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
             reference=reference, **{f"ids_{length}": rows[length] for length in LENGTHS})
    print(f"bundle in {bundle}: {sum(p.stat().st_size for p in bundle.iterdir()) / 1e6:.1f} MB")


def _feeds(ids: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    return {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask, "token_type_ids": np.zeros_like(ids)}


def _median_ms(call, *, min_repeats: int = 10, budget_s: float = 0.25, sync=None) -> float:
    for _ in range(3):
        call()
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < min_repeats or (time.perf_counter() < deadline and len(times) < 500):
        start = time.perf_counter()
        call()
        if sync is not None:
            sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _replay_ms(torch, graph, repeats: int = 50) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _numerics(engines: dict, golden) -> dict:
    """Graph vs eager on the same engine; each precision vs the CPU fp32 reference."""
    ids, mask = golden["input_ids"], golden["attention_mask"]
    feeds = _feeds(ids, mask)
    bucket_length = min(length for length in LENGTHS if length >= ids.shape[1])
    padded = _feeds(*(np.pad(a, ((0, 0), (0, bucket_length - ids.shape[1]))) for a in (ids, mask)))
    reference = golden["reference"].astype(np.float64)
    result = {}
    for name, engine in engines.items():
        try:
            result[name] = _engine_numerics(engine, feeds, padded, reference)
        except Exception as exc:  # noqa: BLE001 - record and go on: one variant must not sink the run
            result[name] = {"error": repr(exc)[:500]}
        log.info("numerics %s: %s", name, result[name])
    return result


def _engine_numerics(engine, feeds: dict, padded: dict, reference: np.ndarray) -> dict:
    graph = engine.infer(feeds)["embedding"].astype(np.float64)
    eager_same_shape = engine.infer_eager(padded)["embedding"].astype(np.float64)  # the bucket's own shape
    eager = engine.infer_eager(feeds)["embedding"].astype(np.float64)  # unpadded
    row_rel = np.linalg.norm(graph - eager_same_shape, axis=1) / np.linalg.norm(eager_same_shape, axis=1)
    cosine = (graph * reference).sum(1) / (np.linalg.norm(graph, axis=1) * np.linalg.norm(reference, axis=1))
    return {
        "graph_vs_eager_max_rel_err": float(row_rel.max()),
        "graph_vs_eager_max_abs_err": float(np.abs(graph - eager_same_shape).max()),
        "graph_vs_unpadded_eager_max_abs_err": float(np.abs(graph - eager).max()),
        "cosine_to_fp32_min": float(cosine.min()),
        "cosine_to_fp32_mean": float(cosine.mean()),
        "finite": bool(np.isfinite(graph).all()),
        "texts": int(len(reference)),
    }


def _transformers_baseline(torch, weights_path: Path, golden) -> dict:
    """transformers BertModel fp16 eager and one captured graph (the reference measurement), device time."""
    try:
        from transformers import BertConfig, BertModel
    except Exception as exc:  # noqa: BLE001 - optional baseline; say why it is missing
        return {"error": f"transformers unavailable: {exc}"}
    from fastpath.engines.torch.weights import load_weights

    config, tensors = load_weights(weights_path)
    model = BertModel(BertConfig(**dataclasses.asdict(config)), add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    log.info("transformers BertModel: missing %s, unexpected %s", missing, unexpected)
    model = model.half().cuda().eval()
    out = {}
    for batch, length in ((1, 32), (4, 32), (64, 32), (64, 128), (256, 128)):
        ids = torch.from_numpy(golden[f"ids_{length}"][:batch]).cuda()
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            eager = _median_ms(lambda ids=ids, mask=mask: model(input_ids=ids, attention_mask=mask), sync=torch.cuda.synchronize)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    model(input_ids=ids, attention_mask=mask)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(input_ids=ids, attention_mask=mask)
        out[f"{batch}x{length}"] = {"eager_ms": eager, "replay_ms": _replay_ms(torch, graph)}
        log.info("transformers %dx%d: %s", batch, length, out[f"{batch}x{length}"])
    return out


def _timings(torch, engines: dict, golden) -> list[dict]:
    rows = []
    for length in LENGTHS:
        for batch in BATCHES:
            feeds = _feeds(golden[f"ids_{length}"][:batch])
            fp16 = engines["fp16"]
            row = {"batch": batch, "length": length,
                   "eager_ms": _median_ms(lambda fp16=fp16, feeds=feeds: fp16.infer_eager(feeds)),
                   "graph_ms": _median_ms(lambda fp16=fp16, feeds=feeds: fp16.infer(feeds)),
                   "replay_ms": _replay_ms(torch, fp16.runner.graph(fp16.grid.select(batch, length)))}
            for name in ("fp32", "fp8"):
                if name in engines:
                    try:
                        row[f"{name}_graph_ms"] = _median_ms(lambda e=engines[name], feeds=feeds: e.infer(feeds))
                    except Exception as exc:  # noqa: BLE001 - record and go on
                        row[f"{name}_error"] = repr(exc)[:300]
            row["graph_sequences_per_s"] = batch / row["graph_ms"] * 1e3
            row["eager_over_graph"] = row["eager_ms"] / row["graph_ms"]
            issue = ISSUE_GRAPH_MS.get((batch, length))
            if issue:
                row["issue_graph_ms"] = issue
                row["graph_over_issue"] = row["graph_ms"] / issue
            rows.append(row)
            log.info("timing %s", row)
    return rows


def _table(rows: list[dict]) -> str:
    header = f"{'B':>4} {'L':>4} {'eager ms':>9} {'graph ms':>9} {'replay ms':>9} {'eager/graph':>11} {'fp32 ms':>8} {'fp8 ms':>8} {'seq/s':>9} {'vs issue':>8}"
    lines = [header]
    for r in rows:
        lines.append(f"{r['batch']:>4} {r['length']:>4} {r['eager_ms']:>9.3f} {r['graph_ms']:>9.3f} {r['replay_ms']:>9.3f} "
                     f"{r['eager_over_graph']:>11.1f} {r.get('fp32_graph_ms', float('nan')):>8.3f} {r.get('fp8_graph_ms', float('nan')):>8.3f} "
                     f"{r['graph_sequences_per_s']:>9.0f} {r.get('graph_over_issue', float('nan')):>8.2f}")
    return "\n".join(lines)


def _build_engines(torch, weights: Path) -> tuple[dict, dict]:
    """FP16, FP32 and FP8 engines over the same buckets, with capture time and memory (FP8 may fail: recorded)."""
    from fastpath.engines.torch import TorchEngine

    engines, capture_s = {}, {}
    for precision in ("fp16", "fp32", "fp8"):
        started = time.perf_counter()
        try:
            engines[precision] = TorchEngine(str(weights), device="cuda", precision=precision, batch_sizes=BATCHES,
                                             lengths=LENGTHS)
        except Exception as exc:  # noqa: BLE001 - fp8 is optional; record why it failed
            log.error("%s engine failed: %r", precision, exc)
            capture_s[precision] = f"failed: {exc!r}"[:500]
            continue
        torch.cuda.synchronize()
        capture_s[precision] = {"seconds": round(time.perf_counter() - started, 2),
                                "graphs": len(engines[precision].buckets),
                                "cuda_memory_allocated_mb": round(torch.cuda.memory_allocated() / 2**20, 1),
                                "cuda_memory_reserved_mb": round(torch.cuda.memory_reserved() / 2**20, 1)}
    return engines, capture_s


def run(bundle: Path, out: Path) -> int:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.FileHandler(out / "engines_bench.log"), logging.StreamHandler(sys.stderr)])
    golden = dict(np.load(bundle / "golden.npz"))
    weights = bundle / "model.fp16.safetensors"
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "numpy": np.__version__,
           "capability": list(torch.cuda.get_device_capability())}
    log.info("environment %s", env)
    engines, capture_s = _build_engines(torch, weights)
    numerics = _numerics(engines, golden)
    rows = _timings(torch, engines, golden)
    address_check = {}
    for batch, length in ((1, 32), (64, 128)):
        feeds = _feeds(golden[f"ids_{length}"][:batch])
        runner = engines["fp16"].runner
        off = _median_ms(lambda feeds=feeds: engines["fp16"].infer(feeds))
        runner.check_addresses = True
        on = _median_ms(lambda feeds=feeds: engines["fp16"].infer(feeds))
        runner.check_addresses = False
        address_check[f"{batch}x{length}"] = {"graph_ms": off, "graph_ms_with_address_check": on}
    log.info("address check cost %s", address_check)
    try:
        baseline = _transformers_baseline(torch, weights, golden)
    except Exception as exc:  # noqa: BLE001 - the baseline is optional
        baseline = {"error": repr(exc)[:500]}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                            "tests/gpu/test_torch_runtime.py", "tests/gpu/test_graphs.py"],
                           capture_output=True, text=True, env={**os.environ, "FASTPATH_TORCH_BUNDLE": str(bundle)})
    (out / "engines_tests.log").write_text(tests.stdout + tests.stderr)
    result = {"environment": env, "capture": capture_s, "numerics": numerics, "latency": rows, "address_check": address_check,
              "transformers_baseline": baseline, "issue_figures": {"graph_ms": {f"{b}x{n}": v for (b, n), v in ISSUE_GRAPH_MS.items()},
                                                                  "eager_ms": ISSUE_EAGER_MS},
              "tests": {"returncode": tests.returncode, "summary": tests.stdout.strip().splitlines()[-1:]}}
    (out / "engines_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(numerics, indent=1))
    print(json.dumps(baseline, indent=1))
    print("capture:", json.dumps(capture_s))
    print("address check:", json.dumps(address_check))
    print("tests:", tests.returncode, result["tests"]["summary"])
    print(_table(rows))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("prepare", "run"))
    parser.add_argument("--bundle", type=Path, default=Path(".carry/engines"))
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--version-dir", type=Path, default=Path("model_repository/text_embedding/1"), help="built fp32 version (prepare)")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.bundle, args.sentences, args.version_dir)
        return 0
    return run(args.bundle, args.out)


if __name__ == "__main__":
    sys.exit(main())
