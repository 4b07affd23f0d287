"""FastPath's Python around the engine on the c=1 inline path, in-process, against a naive call.

Run from the repository root with the artifacts built:

    .venv/bin/python scripts/inline_overhead.py --texts 400 --repeats 3

Loads the shipped text_embedding version 1 (ONNX Runtime fp32) with the scheduler of
``model_repository/text_embedding`` (queue, runner with its lanes, staging pool, warm-up), then for
each corpus sentence, alternating, times:

- ``fastpath``: what ``execute()`` does for a lone request under ``inline_when_idle``
  (claim_idle, tokenize, submit, drain_inline: plan, stage into the pool, engine, deliver, build the
  four output arrays), minus the engine call itself;
- ``naive``: tokenize, pad into new arrays, the engine call, build the output arrays, minus the
  engine call (what ``benchmarks/models/naive_embedding`` does per request);
- ``engine``: the engine call alone (its median, for scale).

A 0.6 ms sleep precedes each call (a closed-loop client's round trip; ``claim_idle`` needs 0.5 ms of
idle). Prints the median tokenize time and the median Python overhead per request in ms. No
Triton: pb_utils tensors and the response sender are not in it (``scripts/phase_profile.py`` measures
them in the stub). Used on 2026-11-30 (eighth session) to trim the inline path: overhead 0.63 ->
0.48 ms here, naive's 0.06 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "backend"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=400, help="corpus sentences per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("FASTPATH_STATE_DIR", tempfile.mkdtemp(prefix="fastpath-inline-"))

    import numpy as np

    from fastpath.memory import create_host_pool
    from fastpath.models.text_embedding.batches import EmbeddingBatchHandler, staging_pool_config, warm_up
    from fastpath.models.text_embedding.config import TextEmbeddingConfig
    from fastpath.models.text_embedding.model import OUTPUT_NAMES, _output_array, scheduler_length_buckets
    from fastpath.models.text_embedding.versions import VersionedEmbedder
    from fastpath.scheduling import BatchQueue, BatchRunner, CostModel, Ticket, WorkItem
    from fastpath.scheduling.config import SchedulerConfig
    from fastpath.text.corpus import pydoc_sentences

    config, sched = TextEmbeddingConfig(), SchedulerConfig()
    versions = VersionedEmbedder(REPO / "model_repository" / "text_embedding", 1, config, instance="inline_overhead",
                                 model_name="text_embedding")
    embedder = versions.initial
    pool = create_host_pool(staging_pool_config(sched.batch_buckets[-1], config.max_seq_length), name="staging")
    handler = EmbeddingBatchHandler(versions, pool)
    queue = BatchQueue(batch_buckets=sched.batch_buckets,
                       length_buckets=scheduler_length_buckets(config.length_buckets_tokens, config.max_seq_length),
                       costs=CostModel(sched.cost_ewma_alpha), max_queue_delay_s=sched.max_queue_delay_us * 1e-6,
                       max_texts=sched.max_queue_texts, min_padding_gain=sched.min_padding_gain,
                       pad_to_longest=not embedder.engine.buckets)
    runner = BatchRunner(queue, handler, lanes=max(1, embedder.engine.lanes), stage_lead_s=sched.stage_lead_us * 1e-6)
    warm_up(handler, queue, runner.clock)
    runner.start()

    engine, output = embedder.engine, embedder.engine.outputs[0].name
    last_engine_s = [0.0]
    infer = engine.infer

    def timed_infer(feeds):  # the inline path runs the wide session (engine.infer), as naive does
        start = time.perf_counter()
        result = infer(feeds)
        last_engine_s[0] = time.perf_counter() - start
        return result

    engine.infer = timed_infer

    def fastpath(text: str) -> tuple[float, float]:
        start = time.perf_counter()
        if not runner.claim_idle():
            raise RuntimeError("the runner was not idle")
        encodings = embedder.tokenizer.encode([text])
        tokenized = time.perf_counter()
        outputs = []
        ticket = Ticket(1, lambda _t, rows, _e: outputs.append([_output_array(n, rows) for n in OUTPUT_NAMES]))
        runner.submit([WorkItem(ticket, 0, len(encodings[0].ids), encodings[0], 0)], timeout_s=None)
        runner.drain_inline()
        runner.release_inline()
        if len(outputs) != 1:
            raise RuntimeError("the request was not answered exactly once")
        return tokenized - start, time.perf_counter() - tokenized - last_engine_s[0]

    def naive(text: str) -> tuple[float, float]:
        start = time.perf_counter()
        encodings = embedder.tokenizer.encode([text])
        tokenized = time.perf_counter()
        feeds = embedder.tokenizer.pad(encodings, len(encodings[0].ids)).feeds()
        embeddings = engine.infer(feeds)[output]
        [np.ascontiguousarray(embeddings, dtype=np.float32), np.array([[len(e.ids)] for e in encodings], np.int32),
         np.array([[len(e.overflowing) > 0] for e in encodings], np.bool_)]
        return tokenized - start, time.perf_counter() - tokenized - last_engine_s[0]

    texts = pydoc_sentences()
    random.Random(0).shuffle(texts)
    texts = texts[: args.texts]
    results: dict[str, list[tuple[float, float]]] = {"fastpath": [], "naive": []}
    engine_s = []
    try:
        for _ in range(args.repeats):
            for text in texts:
                for name, run in (("fastpath", fastpath), ("naive", naive)):
                    time.sleep(0.6e-3)
                    results[name].append(run(text))
                    engine_s.append(last_engine_s[0])
    finally:
        runner.close()
        handler.close()
        pool.close()
        versions.close()
    print(f"{len(texts) * args.repeats} requests per path; engine call p50 {statistics.median(engine_s) * 1e3:.3f} ms")
    print("| path | tokenize p50 ms | Python around the engine p50 ms | mean ms |")
    print("|---|---:|---:|---:|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(v[0] for v in values) * 1e3:.3f} | "
              f"{statistics.median(v[1] for v in values) * 1e3:.3f} | {statistics.fmean(v[1] for v in values) * 1e3:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
