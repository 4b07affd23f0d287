"""Bucket dispatch: which captured (batch, length) shape serves a batch, or none (eager).

Pure Python, no CUDA: the part of the CUDA-graph mechanism that decides, kept apart from the part
that captures and replays (:mod:`fastpath.graphs.runner`), as vLLM v1 splits its
``CudagraphDispatcher`` from the capture wrapper. A batch of ``n`` sequences of ``l`` tokens is
served by the smallest captured batch size ``>= n`` and the smallest captured length ``>= l``
(``bisect_left`` on sorted lists, as SGLang's ``cuda_graph_runner`` picks its batch bucket).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable

from fastpath.errors import ConfigError


@dataclasses.dataclass(frozen=True, order=True)
class Bucket:
    """One captured shape: ``batch`` sequences of ``length`` tokens.

    Attributes:
        batch: rows of the static input buffers (sequences).
        length: columns of the static input buffers (tokens per sequence).
    """

    batch: int
    length: int

    @property
    def tokens(self) -> int:
        """``batch * length``: elements of one input tensor of this bucket."""
        return self.batch * self.length


def _sorted_sizes(name: str, values: Iterable[int]) -> tuple[int, ...]:
    sizes = tuple(sorted(set(int(v) for v in values)))
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"{name} = {tuple(values)!r}: expected a non-empty list of positive integers")
    return sizes


class BucketGrid:
    """The captured shapes: every combination of ``batch_sizes`` x ``lengths``.

    Args:
        batch_sizes: batch sizes to capture (any order; duplicates are dropped).
        lengths: sequence lengths in tokens to capture (any order; duplicates are dropped).

    Raises:
        ConfigError: an empty list, or a size below 1.
    """

    def __init__(self, batch_sizes: Iterable[int], lengths: Iterable[int]) -> None:
        self.batch_sizes = _sorted_sizes("batch_sizes", batch_sizes)
        self.lengths = _sorted_sizes("lengths", lengths)

    def __repr__(self) -> str:
        return f"BucketGrid(batch_sizes={self.batch_sizes}, lengths={self.lengths})"

    @property
    def max_batch(self) -> int:
        """Largest captured batch size."""
        return self.batch_sizes[-1]

    @property
    def max_length(self) -> int:
        """Largest captured sequence length in tokens."""
        return self.lengths[-1]

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        """All buckets, smallest first (by batch, then length)."""
        return tuple(Bucket(b, length) for b in self.batch_sizes for length in self.lengths)

    def capture_order(self) -> list[Bucket]:
        """Buckets largest first (by tokens, then batch), the order to capture into one shared pool.

        Capturing the largest graph first lets the smaller ones reuse its memory in the shared pool
        (PyTorch "CUDA Graphs" notes, SGLang ``cuda_graph_runner``).
        """
        return sorted(self.buckets, key=lambda b: (b.tokens, b.batch), reverse=True)

    def select(self, batch: int, length: int) -> Bucket | None:
        """The smallest bucket that holds ``batch`` sequences of ``length`` tokens.

        Args:
            batch: sequences in the batch, >= 1.
            length: tokens of the longest sequence (its padded length), >= 1.

        Returns:
            The bucket, or ``None`` when the batch is larger than ``max_batch`` or the sequences
            longer than ``max_length`` (the caller then splits the batch or runs it eagerly).

        Raises:
            ValueError: ``batch`` or ``length`` is below 1; an empty batch must never reach an
                engine.
        """
        if batch < 1 or length < 1:
            raise ValueError(f"batch of {batch} sequences x {length} tokens: an engine needs at least 1 x 1")
        row = bisect.bisect_left(self.batch_sizes, batch)
        column = bisect.bisect_left(self.lengths, length)
        if row == len(self.batch_sizes) or column == len(self.lengths):
            return None
        return Bucket(self.batch_sizes[row], self.lengths[column])
