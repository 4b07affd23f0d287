"""The GPU served benchmark's mixed workload (benchmarks/gpu/served_gpu.py, fastpath.text.corpus.pydoc_paragraphs): documentation paragraphs as
written, so one-line paragraphs and long passages come in a real corpus's proportion."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from text_workloads import WORKLOADS, token_lengths  # noqa: E402

from fastpath.text.corpus import pydoc_paragraphs  # noqa: E402

TOKENIZER = ROOT / "model_repository" / "text_embedding" / "1" / "tokenizer.json"


def test_the_mixed_workload_holds_sentences_and_passages_one_per_request():
    """Invariant: every entry is one whole paragraph (no blank line inside, at least 20 characters, whitespace
    collapsed), the same texts every run, and both one-sentence paragraphs (< 32 tokens) and passages past
    the 256-token truncation are among them."""
    texts = pydoc_paragraphs()
    assert texts == pydoc_paragraphs() and WORKLOADS["mixed"] == 1
    assert all(len(t) >= 20 and "\n" not in t and "  " not in t for t in texts)
    stats = token_lengths(TOKENIZER, texts)
    assert stats["texts"] == len(texts) > 1000
    assert stats["median_tokens"] < stats["p90_tokens"] and 0 < stats["truncated_share"] < 0.5
    assert token_lengths(TOKENIZER, sorted(texts, key=len)[:100])["p90_tokens"] < 32
