"""Decoding and tokenization of request texts, matching sentence-transformers.

all-MiniLM-L6-v2's shipped ``tokenizer.json`` is configured to truncate at 128 tokens and pad every
sequence to a fixed 128 (its ``truncation``/``padding`` sections). sentence-transformers ignores
both: it truncates at the model's ``max_seq_length`` (256) and pads to the longest sequence of the
batch. Loading the file as-is would therefore cut texts at 128 tokens and pad everything to 128, so
:class:`TextTokenizer` resets both settings, so a text's tokens never depend on its batch neighbours.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from fastpath.errors import InvalidInputError

MAX_NAMED_PROBLEMS = 5  # bad elements named in one error message; the rest are counted


def decode_texts(values: np.ndarray, *, tensor: str, max_text_bytes: int) -> list[str]:
    """Decode a Triton BYTES tensor into Python strings.

    Policy for invalid UTF-8: the request fails with a 400 naming the tensor, the element and the
    offending byte. NUL and other control characters are valid UTF-8 and are
    left to the tokenizer, which drops them as sentence-transformers does.

    Args:
        values: object array of ``bytes`` (or ``str``) of any shape; flattened row-major.
        tensor: tensor name for error messages, e.g. ``"TEXT"``.
        max_text_bytes: largest accepted size of one element, in bytes.

    Returns:
        One string per element.

    Raises:
        InvalidInputError: an element is not UTF-8, is larger than ``max_text_bytes``, or is not bytes; the
            message names each such element (the first five, then a count).
    """
    texts: list[str] = []
    problems: list[str] = []  # every bad element is named (the first MAX_NAMED_PROBLEMS), not only the first
    for index, value in enumerate(values.reshape(-1)):
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogatepass")
        elif isinstance(value, (bytes, bytearray, np.bytes_)):
            raw = bytes(value)
        else:
            problems.append(f"{tensor}[{index}] has type {type(value).__name__}; expected UTF-8 encoded bytes (TYPE_STRING)")
            continue
        if len(raw) > max_text_bytes:
            problems.append(f"{tensor}[{index}] is {len(raw)} bytes; the limit is {max_text_bytes} bytes per text "
                            "(parameter max_text_bytes): split the text or raise the limit")
            continue
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problems.append(f"{tensor}[{index}] is not valid UTF-8: {_utf8_fault(raw, exc)}; send text encoded as UTF-8")
    if problems:
        more = len(problems) - MAX_NAMED_PROBLEMS
        raise InvalidInputError("; ".join(problems[:MAX_NAMED_PROBLEMS]) + (f"; and {more} more bad elements of {tensor}" if more > 0 else ""))
    return texts


def _utf8_fault(raw: bytes, exc: UnicodeDecodeError) -> str:
    """Where and why ``raw`` is not UTF-8. A UTF-16 surrogate (U+D800-U+DFFF) encoded as three bytes, which Python's
    decoder calls an "invalid continuation byte" at the lead byte 0xED, is named as what it is."""
    start = exc.start
    three = raw[start : start + 3]
    if len(three) == 3 and three[0] == 0xED and 0xA0 <= three[1] <= 0xBF and 0x80 <= three[2] <= 0xBF:
        code = three.decode("utf-8", "surrogatepass")
        return f"bytes {three.hex(' ')} at offset {start} encode the UTF-16 surrogate U+{ord(code):04X}, which UTF-8 excludes"
    return f"byte 0x{raw[start]:02x} at offset {start} ({exc.reason})"


@dataclasses.dataclass(frozen=True)
class EncodedBatch:
    """A padded batch of token ids, ready for a BERT engine.

    Attributes:
        input_ids: int64 [batch, length] token ids, padded with the pad id (0).
        attention_mask: int64 [batch, length], 1 for real tokens, 0 for padding.
        token_type_ids: int64 [batch, length], all 0 (single-segment input).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    def feeds(self) -> dict[str, np.ndarray]:
        """The three arrays keyed by their ONNX input names."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }


PREFIX_CHARS_PER_TOKEN = 64  # prefix budget per token of max_seq_length; real text averages ~4-6 characters per token
PREFIX_GROWTH = 4  # a prefix too short to overflow is retried this many times longer, up to the whole text

# Characters before which a text can be cut without changing the tokens before the cut: BERT's normalizer works per
# character and its pre-tokenizer ends a word at each of them (tokenizers' BertNormalizer and BertPreTokenizer):
# ASCII whitespace and punctuation, the space separators U+00A0 and U+3000 (normalized to a space), common CJK and
# general punctuation (Unicode category P), and CJK ideographs (BERT's ranges; the normalizer pads each with spaces).
# Each is a starter (canonical combining class 0), so accent stripping (NFD) cannot join it to what precedes it.
_SPLIT_CHARS = (" \t\n\r" + "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
                + "\u00a0\u3000\u3001\u3002\u300c\u300d\u300e\u300f\u3010\u3011\uff01\uff08\uff09\uff0c\uff1a\uff1b\uff1f"
                + "\u2013\u2014\u2018\u2019\u201c\u201d\u2026")
_SPLIT_AT = re.compile("[" + re.escape(_SPLIT_CHARS) + "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _split_prefix(text: str, limit: int) -> str | None:
    """``text`` up to its last split point (a character of :data:`_SPLIT_AT`) at or before ``limit`` characters;
    None if the text is not longer than ``limit`` or has no split point there (then the whole text is tokenized).

    The prefix's tokens are exactly the first tokens of the whole text; a 1 MiB text without spaces (punctuation,
    CJK) is cut like one with them, so no text within ``max_text_bytes`` costs a full tokenization unless its
    tokens are few (words over WordPiece's 100 characters, one ``[UNK]`` each).
    """
    if len(text) <= limit:
        return None
    found = _SPLIT_AT.search(text[limit::-1])  # the first split character going back from ``limit``
    cut = limit - found.start() if found else 0
    return text[:cut] if cut > 0 else None


PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"


def set_tokenizer_parallelism(enabled: bool, threads: int = 0) -> None:
    """Turn HF tokenizers' Rayon parallelism in ``encode_batch`` on or off for this process.

    tokenizers reads ``TOKENIZERS_PARALLELISM`` on every batch call (tokenizers
    ``utils/parallelism.rs``), so setting it here takes effect at once. A python-backend stub
    serves one model instance, so the setting is that instance's (``tokenizer_parallelism``).

    Args:
        enabled: spread each ``encode_batch`` over the Rayon thread pool.
        threads: the pool's size (``RAYON_NUM_THREADS``, read once, when the pool starts at the
            first parallel call); 0 leaves Rayon's default of one thread per core. An
            explicit ``RAYON_NUM_THREADS`` in the environment wins.
    """
    os.environ[PARALLELISM_ENV] = "true" if enabled else "false"
    if enabled and threads > 0:
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))


class TextTokenizer:
    """WordPiece tokenizer from a HF ``tokenizer.json``, configured as sentence-transformers uses it.

    Args:
        path: the model's ``tokenizer.json``.
        max_seq_length: truncation length in tokens, special tokens included (256 for
            all-MiniLM-L6-v2, from its ``sentence_bert_config.json``).
    """

    def __init__(self, path: str | Path, *, max_seq_length: int) -> None:
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=max_seq_length)
        self.max_seq_length = max_seq_length
        self.pad_id = 0

    def encode(self, texts: Sequence[str], *, parallel: bool | None = None) -> list[Encoding]:
        """Tokenize texts (without the GIL, inside ``tokenizers``).

        ``parallel``: True spreads this call over the Rayon pool, False runs it on the calling
        thread, None leaves the process's setting (:func:`set_tokenizer_parallelism`); the result
        is the same either way.

        A text longer than ``max_seq_length * PREFIX_CHARS_PER_TOKEN`` characters is first
        tokenized only up to its last split point before that length (:func:`_split_prefix`:
        whitespace, punctuation, CJK ideographs). BERT's normalizer works per character and its
        pre-tokenizer ends a word at each such character before WordPiece runs per word, so the
        prefix's tokens are exactly the first tokens of the whole text; when the prefix alone
        already overflows ``max_seq_length``, its truncated encoding *is* the text's. Otherwise
        (few tokens in many characters) a prefix ``PREFIX_GROWTH`` times longer is tried, up to
        the whole text. Without this, a 1 MiB text takes 0.2-1.8 s and its overflow encodings
        hundreds of MB; 64 of them in one request kept a stub busy past its stall timeout.

        Returns:
            One ``tokenizers.Encoding`` per text; ``len(e.ids)`` <= ``max_seq_length``, and
            ``e.overflowing`` is non-empty when the text was truncated.
        """
        texts = list(texts)
        # encode_batch_fast: encode_batch without character offsets or token strings, which nothing here reads (ids,
        # masks, type ids and overflow are the same); less tokenizer time per text (docs/benchmarks/tokenizer_cpu.md)
        if parallel is not None:  # tokenizers reads it on every batch call
            os.environ[PARALLELISM_ENV] = "true" if parallel else "false"
        encodings: list[Encoding | None] = [None] * len(texts)
        pending, limit = list(range(len(texts))), self.max_seq_length * PREFIX_CHARS_PER_TOKEN
        while pending:  # at most log4(1 MiB / 16 KiB) + 1 = 4 rounds; nearly every text ends in the first
            prefixes = [_split_prefix(texts[i], limit) for i in pending]
            batch = self._tokenizer.encode_batch_fast(
                [texts[i] if prefix is None else prefix for i, prefix in zip(pending, prefixes)], add_special_tokens=True)
            retry = []
            for i, prefix, encoding in zip(pending, prefixes, batch):
                if prefix is None or encoding.overflowing:
                    encodings[i] = encoding
                else:
                    retry.append(i)
            pending, limit = retry, limit * PREFIX_GROWTH
        return encodings

    def truncated(self, encoding: Encoding) -> bool:
        """Whether :meth:`encode` cut the text at ``max_seq_length``: only an encoding of exactly that many tokens
        can have overflowed, so no other one's ``overflowing`` (a list of Encodings) is built."""
        return len(encoding) >= self.max_seq_length and bool(encoding.overflowing)

    def pad(self, encodings: Sequence[Encoding], length: int, out: EncodedBatch | None = None) -> EncodedBatch:
        """Pad encodings to ``length`` tokens into int64 arrays of shape [len(encodings), length].

        Args:
            out: arrays to fill in place (each int64 [len(encodings), length], e.g. views of a
                staging-pool block); new arrays when None. Every element is written.

        Raises:
            ValueError: an encoding is longer than ``length`` (a caller bug, not user input), or
                ``out`` has the wrong shape or dtype.
        """
        batch = len(encodings)
        if out is None:
            out = EncodedBatch(np.empty((batch, length), np.int64), np.empty((batch, length), np.int64),
                               np.empty((batch, length), np.int64))
        elif any(a.shape != (batch, length) or a.dtype != np.int64 for a in (out.input_ids, out.attention_mask, out.token_type_ids)):
            raise ValueError(f"pad(out=...) needs three int64 arrays of shape ({batch}, {length})")
        input_ids, attention_mask = out.input_ids, out.attention_mask
        input_ids.fill(self.pad_id)
        attention_mask.fill(0)
        out.token_type_ids.fill(0)
        for row, encoding in enumerate(encodings):
            ids = encoding.ids
            if len(ids) > length:
                raise ValueError(f"encoding of {len(ids)} tokens does not fit padded length {length}")
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
        return out
