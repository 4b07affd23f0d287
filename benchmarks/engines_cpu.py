"""INT8 vs FP32 on the CPU with ONNX Runtime (raw engine, no server): throughput and accuracy.

    .venv/bin/python benchmarks/engines_cpu.py [--threads 2] [--rounds 5] [--out docs/benchmarks]

Both versions (``text_embedding/1`` fp32, ``text_embedding/2`` INT8 QDQ, built by
``fastpath build --int8``) run side by side in one process: for every (batch, length) point the two
sessions alternate for ``--rounds`` rounds of ``--seconds`` each, so machine noise hits both alike
(the dev machines have 2 cores shared with other work). Each variant's best round (the least
disturbed, as ``timeit`` takes the minimum) and median round are reported; the INT8/FP32 ratio is
of the best rounds. Inputs are full-length rows of real text (evaluation split, no padding); accuracy is
the cosine of INT8 to FP32 embeddings on held-out sentences. Prints a table; writes
``engines_cpu.json`` and ``engines_cpu.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from fastpath.artifacts.accuracy import embed_batches, report
from fastpath.artifacts.quantize import text_batches
from fastpath.artifacts.torch_weights import evaluation_texts
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.text import TextTokenizer

MODEL_DIR = Path("model_repository/text_embedding")
POINTS = ((1, 32), (8, 32), (32, 32), (1, 128), (8, 128), (32, 128))


def full_rows(tokenizer: TextTokenizer, length: int, rows: int) -> dict[str, np.ndarray]:
    """``rows`` sequences of exactly ``length`` tokens of real text: [CLS] ... [SEP], no padding."""
    tokens = [i for e in tokenizer.encode(evaluation_texts(2000)) for i in e.ids[1:-1]]
    body = length - 2
    ids = np.array([[101, *tokens[r * body : (r + 1) * body], 102] for r in range(rows)], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def sequences_per_s(engine: OnnxRuntimeEngine, feeds: dict[str, np.ndarray], seconds: float) -> float:
    engine.infer(feeds)
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds or count < 2:
        engine.infer(feeds)
        count += 1
    return count * len(feeds["input_ids"]) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--accuracy-texts", type=int, default=512)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = parser.parse_args()
    tokenizer = TextTokenizer(MODEL_DIR / "1" / "tokenizer.json", max_seq_length=256)
    engines = {name: OnnxRuntimeEngine(str(MODEL_DIR / version / "model.onnx"), intra_op_threads=args.threads)
               for name, version in (("fp32", "1"), ("int8", "2"))}
    texts = evaluation_texts(args.accuracy_texts)
    batches = text_batches(texts, tokenizer, 32)
    embeddings = {name: embed_batches(lambda f, e=engine: e.infer(f)["embedding"], batches) for name, engine in engines.items()}
    accuracy = report(embeddings["fp32"], embeddings["int8"], texts, reference_name="fp32 model.onnx", candidate_name="int8 model.onnx",
                      split="pydoc evaluation split").to_dict()
    rows = []
    for batch, length in POINTS:
        feeds = full_rows(tokenizer, length, batch)
        samples: dict[str, list[float]] = {"fp32": [], "int8": []}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                samples[name].append(sequences_per_s(engine, feeds, args.seconds))
        row = {"batch": batch, "length": length, **{f"{n}_seq_per_s": max(s) for n, s in samples.items()},
               **{f"{n}_median_seq_per_s": statistics.median(s) for n, s in samples.items()}, "samples": samples}
        row["int8_over_fp32"] = row["int8_seq_per_s"] / row["fp32_seq_per_s"]
        rows.append(row)
        print(f"batch {batch:3d} x {length:3d}: fp32 {row['fp32_seq_per_s']:7.1f}  int8 {row['int8_seq_per_s']:7.1f} seq/s  ratio {row['int8_over_fp32']:.2f}", flush=True)
    import onnxruntime

    result = {"machine": {"cpu_count": os.cpu_count(), "processor": platform.processor(), "onnxruntime": onnxruntime.__version__,
                          "intra_op_threads": args.threads},
              "method": f"{args.rounds} alternating rounds of {args.seconds}s per variant and point; best round (median beside it)",
              "load_average_1m_at_end": os.getloadavg()[0],
              "accuracy": accuracy, "throughput": rows,
              "model_bytes": {name: (MODEL_DIR / v / "model.onnx").stat().st_size for name, v in (("fp32", "1"), ("int8", "2"))}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engines_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    table = ["| batch x tokens | fp32 seq/s best (median) | int8 seq/s best (median) | int8/fp32 (best) |", "|---|---|---|---|"]
    table += [f"| {r['batch']} x {r['length']} | {r['fp32_seq_per_s']:.1f} ({r['fp32_median_seq_per_s']:.1f}) | "
              f"{r['int8_seq_per_s']:.1f} ({r['int8_median_seq_per_s']:.1f}) | {r['int8_over_fp32']:.2f} |" for r in rows]
    summary = (f"INT8 vs FP32 cosine on {accuracy['texts']} held-out sentences: min {accuracy['min_cosine']:.4f}, "
               f"mean {accuracy['mean_cosine']:.4f}; ONNX Runtime {onnxruntime.__version__}, {args.threads} threads, "
               f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end")
    (args.out / "engines_cpu.md").write_text("# ONNX Runtime CPU: INT8 vs FP32 (benchmarks/engines_cpu.py)\n\n" + summary + "\n\n" + "\n".join(table) + "\n")
    print(summary)
    print("\n".join(table))
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
