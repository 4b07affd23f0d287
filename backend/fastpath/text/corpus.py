"""Real English text that ships with Python: sentences and paragraphs from ``pydoc_data.topics``.

Used by tests, benchmarks and INT8 calibration. The split into calibration and evaluation sets is
by a stable hash of each sentence, so the two never overlap and do not depend on ordering.
"""

from __future__ import annotations

import hashlib
import re

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def pydoc_sentences(min_chars: int = 20, max_chars: int = 300) -> list[str]:
    """Unique sentences from the stdlib's pydoc topics, in a stable order.

    Whitespace runs are collapsed to one space; sentences outside [min_chars, max_chars] characters
    are dropped. With the defaults this gives thousands of sentences of 12-72 tokens (median ~28).
    """
    from pydoc_data.topics import topics

    seen: set[str] = set()
    sentences: list[str] = []
    for key in sorted(topics):
        for paragraph in topics[key].split("\n\n"):
            text = " ".join(paragraph.split())
            for sentence in _SENTENCE_END.split(text):
                if min_chars <= len(sentence) <= max_chars and sentence not in seen:
                    seen.add(sentence)
                    sentences.append(sentence)
    return sentences


def pydoc_paragraphs(min_chars: int = 20) -> list[str]:
    """Every paragraph (blank-line separated, whitespace collapsed) of the pydoc topics of at least
    ``min_chars`` characters, in topic order: sentences and passages in a real corpus's own proportion."""
    from pydoc_data.topics import topics

    found = []
    for key in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[key]):
            text = " ".join(block.split())
            if len(text) >= min_chars:
                found.append(text)
    return found


def split_sentences(sentences: list[str], *, evaluation_percent: int = 50) -> tuple[list[str], list[str]]:
    """Split into (calibration, evaluation) by sha256 of each sentence: disjoint and order-independent."""
    calibration: list[str] = []
    evaluation: list[str] = []
    for sentence in sentences:
        bucket = hashlib.sha256(sentence.encode("utf-8")).digest()[0] * 100 // 256
        (evaluation if bucket < evaluation_percent else calibration).append(sentence)
    return calibration, evaluation
