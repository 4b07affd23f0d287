"""The served text_embedding benchmark's workloads (benchmarks/gpu/served_gpu.py): texts per request of each, the
token-length summary a report gives for a corpus, and the pydoc passages of mixed length."""

from __future__ import annotations

import bisect
import random
from pathlib import Path

import numpy as np

WORKLOADS = {"short": 1, "passages": 1, "passages32": 32, "mixed": 1}  # texts per request


def token_lengths(tokenizer_path: Path, texts: list[str], max_tokens: int = 256) -> dict:
    """Median and p90 tokens ([CLS]/[SEP] included, before truncation) and the share over ``max_tokens``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    lengths = np.array([len(e.ids) for e in tokenizer.encode_batch(texts)])
    return {"texts": len(texts), "median_tokens": int(np.median(lengths)), "p90_tokens": int(np.percentile(lengths, 90)),
            "truncated_share": round(float(np.mean(lengths > max_tokens)), 3),
            "median_chars": int(np.median([len(t) for t in texts]))}


def passages(tokenizer_path: Path, *, min_tokens: int = 64, max_tokens: int = 256, seed: int = 0) -> list[str]:
    """pydoc topic text cut into chunks of ``min_tokens``..``max_tokens`` tokens ([CLS]/[SEP] included),
    at word boundaries, each length drawn uniformly (seeded): real prose and code of mixed length."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    rng = random.Random(seed)
    chunks = []
    for key in sorted(topics):
        text = " ".join(topics[key].split())
        encoding = tokenizer.encode(text, add_special_tokens=False)
        words = encoding.word_ids
        starts = [i for i in range(len(words)) if i == 0 or words[i] != words[i - 1]]  # token index of each word's start
        position = 0
        while True:
            target = position + rng.randint(min_tokens, max_tokens) - 2  # room for [CLS] and [SEP]
            if target >= len(words):
                break
            stop = starts[bisect.bisect_right(starts, target) - 1]  # the last word start at or before the target
            if stop <= position:
                break
            chunks.append(text[encoding.offsets[position][0]:encoding.offsets[stop - 1][1]])
            position = stop
    return chunks
