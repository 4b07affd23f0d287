"""text_embedding's TRUNCATED output for a call's texts, against the tokenizer's own overflow."""

from __future__ import annotations

import types

import numpy as np

from fastpath.models.text_embedding.model import TextEmbeddingModel
from fastpath.text import TextTokenizer
from tests.conftest import MODEL_REPOSITORY


def test_truncated_is_true_exactly_for_the_texts_the_tokenizer_cut():
    """Invariant: TRUNCATED[i] == (encoding i overflowed max_seq_length), as bool [n, 1], for calls of texts well
    under the limit (answered without asking any text's overflow), of exactly the limit's tokens (not cut) and over it."""
    tokenizer = TextTokenizer(MODEL_REPOSITORY / "text_embedding" / "1" / "tokenizer.json", max_seq_length=16)
    model = TextEmbeddingModel.__new__(TextEmbeddingModel)
    model.embedder = types.SimpleNamespace(tokenizer=tokenizer)
    exact = " ".join(["word"] * 14)  # 14 words + [CLS] + [SEP] = 16 tokens: fills the limit, not cut
    for texts in (["short text", ""], ["short text", exact], [exact, exact + " more", "hi"]):
        encodings = tokenizer.encode(texts)
        lengths = [len(e.ids) for e in encodings]
        truncated = model._truncated(encodings, lengths)
        assert truncated.dtype == np.bool_ and truncated.shape == (len(texts), 1)
        assert truncated[:, 0].tolist() == [len(e.overflowing) > 0 for e in encodings]
    assert model._truncated(tokenizer.encode([exact + " more"]), [16])[0, 0]
