"""Sentence embeddings with all-MiniLM-L6-v2 semantics.

Pipeline (sentence-transformers ``encode()`` for this model, modules.json): WordPiece tokenization
truncated at ``max_seq_length`` (256) -> BERT -> mean pooling over the attention mask -> L2
normalization. Pooling and normalization are part of the exported ONNX graph
(:mod:`fastpath.artifacts.export`), so an engine maps padded token ids straight to unit vectors.

Batches are formed by length: texts are sorted by token count, cut into runs of at most
``max_batch_texts``, and each run pads only to the smallest length bucket that holds its longest
member. Padding never changes a row's result: the attention mask excludes pad tokens from attention
and from the mean, so a text's embedding does not depend on its batch neighbours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Encoding

from fastpath.engines import Engine, load_engine
from fastpath.engines.cpus import process_cpus
from fastpath.errors import ArtifactError, EngineError
from fastpath.graphs.buckets import BucketGrid, Sizes, batch_sizes_of
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.text import TextTokenizer

if TYPE_CHECKING:
    from fastpath.scheduling.config import SchedulerConfig

EMBEDDING_DIM = 384  # all-MiniLM-L6-v2 hidden size (config.json "hidden_size")


@dataclasses.dataclass(frozen=True)
class EmbeddingResult:
    """Outputs for N texts, in input order.

    Attributes:
        embeddings: float32 [N, 384], unit L2 norm.
        token_counts: int32 [N], tokens the model saw per text ([CLS] and [SEP] included, <= max_seq_length).
        truncated: bool [N], True where the text was longer than max_seq_length tokens and was cut.
    """

    embeddings: np.ndarray
    token_counts: np.ndarray
    truncated: np.ndarray

    def slice(self, start: int, stop: int) -> EmbeddingResult:
        """Rows ``start:stop`` (views, no copy)."""
        return EmbeddingResult(self.embeddings[start:stop], self.token_counts[start:stop], self.truncated[start:stop])


def padded_length(longest: int, buckets: Sequence[int], max_seq_length: int) -> int:
    """Smallest length bucket >= ``longest``, or ``longest`` itself when no bucket holds it.

    Args:
        longest: token count of the longest sequence in the batch.
        buckets: strictly increasing bucket lengths in tokens.
        max_seq_length: no batch pads beyond this.
    """
    bucket = Sizes(buckets, name="length_buckets_tokens").up(longest)
    if bucket is None:
        return longest
    return min(bucket, max(longest, max_seq_length))


def scheduler_length_buckets(buckets: Sequence[int], max_seq_length: int) -> tuple[int, ...]:
    """The padded lengths batches can have: the config's buckets clipped to ``max_seq_length``, plus it.

    Matches :func:`padded_length` for every text of at most ``max_seq_length`` tokens (the
    tokenizer truncates there).
    """
    return tuple(sorted({min(b, max_seq_length) for b in buckets} | {max_seq_length}))


def scheduler_grid(config: TextEmbeddingConfig, sched: SchedulerConfig, engine: Engine) -> BucketGrid:
    """The (batch size, padded length) grid the model's scheduler batches on, from its loaded engine.

    Batch sizes: ``batch_buckets``, each at most ``max_batch_texts`` and, where the engine captured
    shapes (CUDA graphs, TensorRT profiles), one of the batch sizes it captured, so no batch is
    padded twice. Lengths: :func:`scheduler_length_buckets`.

    Raises:
        ConfigError: ``batch_buckets`` exceeds ``max_batch_texts`` or is not a subset of the
            engine's captured batch sizes (see :meth:`SchedulerConfig.batch_sizes`).
    """
    sizes = sched.batch_sizes(max_rows=config.max_batch_texts, max_rows_name="max_batch_texts",
                              captured=batch_sizes_of(engine.buckets))
    return BucketGrid(sizes, scheduler_length_buckets(config.length_buckets_tokens, config.max_seq_length))


def plan_batches(lengths: Sequence[int], max_batch: int) -> list[list[int]]:
    """Group text indices into batches of similar length.

    Indices are sorted by token count (stable), then cut into runs of at most ``max_batch``.

    Returns:
        Lists of indices into ``lengths``; every index appears exactly once.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[start : start + max_batch] for start in range(0, len(order), max_batch)]


def engine_lanes(config: TextEmbeddingConfig) -> tuple[int, int]:
    """(lanes, threads per lane) of ``config``'s engine; (0, 1): no lanes, one batch at a time.

    Only ONNX Runtime on the CPU has lanes. ``concurrent_batches`` 0 means 2 lanes when the process
    may use 2 or more CPUs (:func:`~fastpath.engines.cpus.process_cpus`). Each lane gets
    ``intra_op_threads`` (0: the process's CPUs) divided by the lanes, at least 1.
    """
    if config.runtime != "onnxruntime" or config.device != "cpu":
        return 0, 1
    cpus = process_cpus()
    lanes = config.concurrent_batches or (2 if cpus >= 2 else 1)
    if lanes <= 1:
        return 0, 1
    return lanes, max(1, (config.intra_op_threads or cpus) // lanes)


def engine_options(config: TextEmbeddingConfig) -> dict[str, object]:
    """Loader options for ``config.runtime`` (see the table in :mod:`fastpath.engines`).

    The torch runtime captures one CUDA graph per (batch, length) bucket: batch buckets are the
    powers of two up to ``max_batch_texts``, lengths the config's length buckets up to ``max_seq_length``.
    """
    if config.runtime == "torch":
        batch_sizes = tuple(1 << i for i in range(config.max_batch_texts.bit_length()) if 1 << i <= config.max_batch_texts)
        lengths = tuple(sorted({min(b, config.max_seq_length) for b in config.length_buckets_tokens}))
        return {"device": config.device, "precision": config.precision, "batch_sizes": batch_sizes, "lengths": lengths,
                "intra_op_threads": config.intra_op_threads, "sync": config.cuda_sync}
    if config.runtime == "onnxruntime":
        lanes, lane_threads = engine_lanes(config)
        return {"intra_op_threads": config.intra_op_threads, "allow_spinning": config.intra_op_spinning,
                "lanes": lanes, "lane_threads": lane_threads}
    return {"intra_op_threads": config.intra_op_threads}


class TextEmbedder:
    """Tokenizer + engine for one model version.

    Args:
        engine: an engine whose ONNX graph maps (input_ids, attention_mask, token_type_ids) int64
            [B, L] to ``embedding`` float32 [B, 384].
        tokenizer: the model's tokenizer.
        config: the model's parameters.
    """

    def __init__(self, engine: Engine, tokenizer: TextTokenizer, config: TextEmbeddingConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self._output_name = engine.outputs[0].name

    @classmethod
    def from_directory(cls, directory: str | Path, config: TextEmbeddingConfig) -> TextEmbedder:
        """Load the artifact and tokenizer of one model version directory.

        Raises:
            ArtifactError: a file is missing (run ``fastpath build``).
            EngineError: the artifact does not load.
        """
        directory = Path(directory)
        for name in (config.artifact, config.tokenizer):
            if not (directory / name).is_file():
                raise ArtifactError(f"{directory / name} is missing; build the artifacts with 'fastpath build'")
        engine = load_engine(config.runtime, str(directory / config.artifact), **engine_options(config))
        tokenizer = TextTokenizer(directory / config.tokenizer, max_seq_length=config.max_seq_length)
        return cls(engine, tokenizer, config)

    def run_encodings(self, encodings: Sequence[Encoding]) -> np.ndarray:
        """Run one batch of encodings (at most ``max_batch_texts``) padded to its length bucket.

        Returns:
            float32 [len(encodings), 384].

        Raises:
            EngineError: the engine failed or returned the wrong shape.
        """
        longest = max(len(e.ids) for e in encodings)
        length = padded_length(longest, self.config.length_buckets_tokens, self.config.max_seq_length)
        batch = self.tokenizer.pad(encodings, length)
        output = self.engine.infer(batch.feeds())[self._output_name]
        if output.shape != (len(encodings), EMBEDDING_DIM):
            raise EngineError(f"engine returned {self._output_name} of shape {output.shape}; expected ({len(encodings)}, {EMBEDDING_DIM})")
        return np.asarray(output, dtype=np.float32)

    def embed_encodings(self, encodings: Sequence[Encoding]) -> EmbeddingResult:
        """Embed already tokenized texts, batching by length; results in input order."""
        count = len(encodings)
        embeddings = np.empty((count, EMBEDDING_DIM), dtype=np.float32)
        lengths = [len(e.ids) for e in encodings]
        for indices in plan_batches(lengths, self.config.max_batch_texts):
            embeddings[indices] = self.run_encodings([encodings[i] for i in indices])
        token_counts = np.asarray(lengths, dtype=np.int32)
        truncated = np.asarray([self.tokenizer.truncated(e) for e in encodings], dtype=np.bool_)
        return EmbeddingResult(embeddings, token_counts, truncated)

    def embed(self, texts: Sequence[str]) -> EmbeddingResult:
        """Embed texts: float32 [N, 384] unit vectors, as sentence-transformers ``encode()`` gives."""
        return self.embed_encodings(self.tokenizer.encode(texts))

    def check_lanes(self, texts: Sequence[str] = ("warm " * 8,) * 4, atol: float = 1e-4) -> None:
        """Run one batch on every engine lane (``concurrent_batches``): each lane's first run pays ONNX
        Runtime's lazy initialization here, not in a request, and must give the main session's result.

        Raises:
            EngineError: a lane failed, or its embeddings differ from the main session's by more than ``atol``.
        """
        if not self.engine.lanes:
            return
        encodings = self.tokenizer.encode(list(texts))
        feeds = self.tokenizer.pad(encodings, max(len(e.ids) for e in encodings)).feeds()
        expected = self.engine.infer(feeds)[self._output_name]
        for lane in range(self.engine.lanes):
            got = self.engine.infer_lane(feeds, lane)[self._output_name]
            error = float(np.max(np.abs(got - expected)))
            if not error <= atol:
                raise EngineError(f"engine lane {lane} differs from the main session by {error:.3g} (max abs, "
                                  f"expected <= {atol}) on the same batch")

    def close(self) -> None:
        """Release the engine (idempotent)."""
        self.engine.close()
