"""Tokenizer time per text: tokenizers' encode_batch against encode_batch_fast (no character offsets), which
``TextTokenizer.encode`` calls.

The shipped tokenizer.json of text_embedding, configured as FastPath runs it (no padding, truncation at 256
tokens), on one thread (``TOKENIZERS_PARALLELISM=false``, as a call of fewer than ``tokenizer_parallel_min_texts``
texts runs). Texts: pydoc sentences (shuffled, seed 0) and pydoc topic paragraphs as written (the served
benchmark's ``mixed`` workload), in calls of ``--batch`` texts (8: a served ``execute()`` at c=64). Each variant
runs ``--rounds`` times, alternating, over the same texts; the table gives the best round's microseconds per
text and the ratio.

    .venv/bin/python benchmarks/tokenizer_cpu.py [--batch 8] [--rounds 7] [--out docs/benchmarks/tokenizer_cpu]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "backend"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from host_report import best_of_rounds, machine_line, write_result  # noqa: E402
from tokenizers import __version__  # noqa: E402

from fastpath.text import TextTokenizer  # noqa: E402
from fastpath.text.corpus import pydoc_paragraphs, pydoc_sentences  # noqa: E402

TOKENIZER = REPO_ROOT / "model_repository" / "text_embedding" / "1" / "tokenizer.json"


def workloads() -> dict[str, list[str]]:
    """short: 3,000 pydoc sentences; paragraphs: every pydoc topic paragraph (the served benchmark's ``mixed``)."""
    sentences = pydoc_sentences()
    random.Random(0).shuffle(sentences)
    return {"short": sentences[:3000], "paragraphs": pydoc_paragraphs()}


def per_text_us(encode, texts: list[str], batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        encode(texts[start:start + batch], add_special_tokens=True)
    return (time.perf_counter() - started) / len(texts) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "tokenizer_cpu")
    args = parser.parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = TextTokenizer(TOKENIZER, max_seq_length=256)._tokenizer  # configured as FastPath runs it
    variants = {"encode_batch": tokenizer.encode_batch, "encode_batch_fast": tokenizer.encode_batch_fast}
    rows = []
    for name, texts in workloads().items():
        best = best_of_rounds({variant: functools.partial(per_text_us, encode, texts, args.batch)
                               for variant, encode in variants.items()}, args.rounds)
        rows.append({"workload": name, "texts": len(texts), "batch": args.batch,
                     **{f"{variant}_us_per_text": round(us, 2) for variant, us in best.items()},
                     "fast_over_default": round(best["encode_batch_fast"] / best["encode_batch"], 3)})
    machine = machine_line(f"tokenizers {__version__}")
    lines = ["| workload | texts | texts per call | encode_batch µs/text | encode_batch_fast µs/text | fast / default |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['texts']} | {r['batch']} | {r['encode_batch_us_per_text']} | "
              f"{r['encode_batch_fast_us_per_text']} | {r['fast_over_default']} |" for r in rows]
    write_result(args.out, title="Tokenizer time per text: encode_batch against encode_batch_fast",
                 intro="`TextTokenizer.encode` calls tokenizers' `encode_batch_fast`, which skips the character offsets nothing "
                       "in FastPath reads (ids, masks, type ids and overflow are the same: tests/unit/test_text.py). One "
                       "thread, truncation at 256 tokens, the best of the rounds.",
                 command=f".venv/bin/python benchmarks/tokenizer_cpu.py --batch {args.batch} --rounds {args.rounds}",
                 machine=machine, settings={"rounds": args.rounds}, rows=rows, table=lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
