"""Does ONNX Runtime's transformer optimizer make the embedding model faster on this CPU? One thread, side by side.

Run from the repository root with the artifacts built (about 1.5 minutes, nothing else running):

    .venv/bin/python scripts/ort_fusion_probe.py | tee docs/benchmarks/ort_fusion_probe_ninth.log

Builds fused variants of the shipped fp32 ``model.onnx`` with ``onnxruntime.transformers.optimizer``
(``model_type="bert"``, 12 heads, hidden size 384; the documented offline optimizer for BERT-style
models): ``fused`` (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization) and
``fused_noattn`` (the same without the Attention fusion). Prints each graph's node count, then
times every variant on one intra-op thread (as one FastPath engine lane runs) at batches of 1, 4 and
16 texts of 30 tokens, ``--repeats`` alternating rounds, reporting the median ms per call and the
largest absolute difference of the output from the shipped model's. Nothing is written but the
temporary models.

2026-11-30 (ninth session, dev machine): the fused graphs were 13-16% slower than the shipped one
under ONNX Runtime's own ORT_ENABLE_ALL, so FastPath does not use them
(docs/benchmarks/scheduler_cpu_runs.md, "ninth session").
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "model_repository" / "text_embedding" / "1" / "model.onnx"


def session(path: Path, threads: int = 1):
    """An ONNX Runtime CPU session with FastPath's graph optimization level and ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def fused(path: Path, out: Path, attention: bool) -> Path:
    """``path`` through ``onnxruntime.transformers.optimizer`` (BERT fusions), saved to ``out``."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_attention = attention
    model = optimizer.optimize_model(str(path), model_type="bert", num_heads=12, hidden_size=384, opt_level=0,
                                     use_gpu=False, optimization_options=options)
    model.save_model_to_file(str(out))
    return out


def feeds(batch: int, length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """int64 [batch, length] token ids (a [CLS] first), attention mask (rows after the first end 3 tokens early), zeros."""
    ids = rng.integers(1000, 20000, (batch, length)).astype(np.int64)
    ids[:, 0] = 101
    mask = np.ones((batch, length), np.int64)
    mask[1:, length - 3:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((batch, length), np.int64)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--length", type=int, default=30)
    args = parser.parse_args(argv)
    import onnx

    with tempfile.TemporaryDirectory(prefix="fastpath-fusion-") as tmp:
        paths = {"shipped": MODEL,
                 "fused": fused(MODEL, Path(tmp) / "fused.onnx", attention=True),
                 "fused_noattn": fused(MODEL, Path(tmp) / "fused_noattn.onnx", attention=False)}
        shipped_runtime = Path(tmp) / "shipped_runtime.onnx"
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(shipped_runtime)
        ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
        for name, path in [("shipped after ORT_ENABLE_ALL", shipped_runtime), *paths.items()]:
            graph = onnx.load(str(path), load_external_data=False).graph
            top = collections.Counter(node.op_type for node in graph.node).most_common(6)
            print(f"{name}: {len(graph.node)} nodes; most common: {', '.join(f'{op} {n}' for op, n in top)}")
        sessions = {name: session(path) for name, path in paths.items()}
        rng = np.random.default_rng(0)
        print(f"\none intra-op thread, median ms per call over {args.repeats} alternating rounds (max |difference| from shipped)")
        for batch in args.sizes:
            inputs = feeds(batch, args.length, rng)
            reference = sessions["shipped"].run(None, inputs)[0]
            times: dict[str, list[float]] = {name: [] for name in sessions}
            for _ in range(args.repeats):
                for name, sess in sessions.items():
                    calls = max(2, 96 // batch)
                    start = time.perf_counter()
                    for _ in range(calls):
                        sess.run(None, inputs)
                    times[name].append((time.perf_counter() - start) / calls)
            base = statistics.median(times["shipped"])
            cells = []
            for name, sess in sessions.items():
                value = statistics.median(times[name])
                error = float(np.abs(sess.run(None, inputs)[0] - reference).max())
                cells.append(f"{name} {value * 1e3:7.3f} ms ({value / base:.2f}x, {error:.1e})")
            print(f"[{batch:2d} x {args.length}]  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
