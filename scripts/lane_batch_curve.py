"""What a bigger batch buys one engine lane: texts/s of a one-thread ONNX Runtime session by batch size.

Run from the repository root with the artifacts built (about 30 s, nothing else running):

    .venv/bin/python scripts/lane_batch_curve.py

Loads the shipped fp32 model as FastPath's text_embedding does (``TextEmbedder``: a main session and
its engine lanes of one intra-op thread each) and runs lane 0 on batches of 1-32 texts of the
corpus' typical length (26-30 tokens, padded to the longest), ``--repeats`` times in turn, 64
texts per measurement. Prints the median texts/s per batch size.

On the 2-core dev machine (2026-11-30, seventh session): 83, 93, 100, 104, 106, 107 texts/s for
batches of 1, 2, 4, 8, 16, 32. FastPath's lanes run ~4 texts per call at concurrency 32, so
perfectly filled batches of 32 of one length would make each lane ~7% faster; forming them from
the ~30 texts of 18 length buckets a closed loop of 32 clients leaves queued costs more padding
than that (docs/benchmarks/scheduler_cpu_runs.md, sixth and seventh sessions).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from scheduler_cpu import ARTIFACTS, by_length, workload_texts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    args = parser.parse_args(argv)

    from fastpath.models.text_embedding.config import TextEmbeddingConfig
    from fastpath.models.text_embedding.pipeline import TextEmbedder

    embedder = TextEmbedder.from_directory(ARTIFACTS, TextEmbeddingConfig())
    if not embedder.engine.lanes:
        raise SystemExit("the engine has no lanes on this machine (concurrent_batches needs 2+ cores)")
    texts = workload_texts()
    lengths, _ = by_length(texts)
    typical = [text for text, length in zip(texts, lengths) if 26 <= length <= 30][: max(args.sizes)]
    encodings = embedder.tokenizer.encode(typical)
    length = max(len(e.ids) for e in encodings)
    rates: dict[int, list[float]] = {size: [] for size in args.sizes}
    for _ in range(args.repeats):
        for size in args.sizes:
            feeds = embedder.tokenizer.pad(encodings[:size], length).feeds()
            calls = max(1, 64 // size)
            start = time.perf_counter()
            for _ in range(calls):
                embedder.engine.infer_lane(feeds, 0)
            rates[size].append(calls * size / (time.perf_counter() - start))
    for size, values in rates.items():
        print(f"lane (1 thread), batch {size:2d} x {length} tokens: {statistics.median(values):6.1f} texts/s  "
              f"(runs: {', '.join(f'{v:.0f}' for v in values)})")
    embedder.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
