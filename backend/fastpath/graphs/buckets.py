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


class ImageSideBuckets:
    """Image shape buckets: each side of a resized image rounds up to the next of a few sizes.

    The image analogue of length buckets. Resized images (sides multiples of 32) are padded at
    the bottom and right to (``snap(h)``, ``snap(w)``), so images of nearby sizes and aspect
    ratios share one batch and one captured graph per batch size. A side above the largest
    bucket keeps its own size (the image runs at its exact shape, without a graph).

    Args:
        sides_px: bucket sides in pixels, multiples of ``stride_px`` (any order; duplicates dropped);
            empty: no buckets, every image keeps its exact shape.
        stride_px: the network's stride (32 for DB).

    Raises:
        ConfigError: a side that is not a positive multiple of ``stride_px``.
    """

    def __init__(self, sides_px: Iterable[int], stride_px: int = 32) -> None:
        self.sides_px = tuple(sorted(set(int(side) for side in sides_px)))
        bad = [side for side in self.sides_px if side < stride_px or side % stride_px]
        if bad:
            raise ConfigError(f"bucket_sides_px = {self.sides_px}: {bad} are not positive multiples of {stride_px}")

    def __repr__(self) -> str:
        return f"ImageSideBuckets(sides_px={self.sides_px})"

    def snap_side(self, side_px: int) -> int:
        """The smallest bucket side >= ``side_px``, or ``side_px`` itself above the largest (or without buckets)."""
        index = bisect.bisect_left(self.sides_px, side_px)
        return self.sides_px[index] if index < len(self.sides_px) else side_px

    def snap(self, shape_hw: tuple[int, int]) -> tuple[int, int]:
        """The (height, width) bucket of a resized image of ``shape_hw``."""
        return self.snap_side(shape_hw[0]), self.snap_side(shape_hw[1])

    def has_graph(self, shape_hw: tuple[int, int]) -> bool:
        """True when both sides of ``shape_hw`` are bucket sides (a graph can serve it)."""
        return shape_hw[0] in self.sides_px and shape_hw[1] in self.sides_px
