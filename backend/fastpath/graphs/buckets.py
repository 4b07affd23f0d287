"""Bucket sets and snapping: the one place that rounds a count or a length to a bucket.

Pure Python, no CUDA: the part of the CUDA-graph mechanism that decides, kept apart from the part
that captures and replays (:mod:`fastpath.graphs.runner`), as vLLM v1 splits its
``CudagraphDispatcher`` from the capture wrapper. A batch of ``n`` sequences of ``l`` tokens is
served by the smallest captured batch size ``>= n`` and the smallest captured length ``>= l``
(``bisect_left`` on sorted lists, as SGLang's ``cuda_graph_runner`` picks its batch bucket).

:class:`Sizes` is a sorted bucket list with its snapping (up, down, next above); the scheduler's
batch policies, the call planner, text_embedding's padded length and text_detection's memory
budget all snap through it. :class:`BucketGrid` is the (batch, length) grid an engine captures,
:class:`ImageSideBuckets` the image analogue of length buckets.
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


class Sizes(tuple):
    """Strictly increasing positive bucket sizes (batch sizes in rows, or lengths in tokens), and snapping to them.

    A tuple: it compares, hashes and prints as the plain tuple of its sizes.

    Args:
        values: the sizes, strictly increasing, each >= 1.
        name: the parameter they come from, for the error message.

    Raises:
        ConfigError: empty, not strictly increasing, or a size below 1 (the message names ``name``).
    """

    def __new__(cls, values: Iterable[int], *, name: str = "sizes") -> Sizes:
        sizes = tuple(int(value) for value in values)
        if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            raise ConfigError(f"{name} = {','.join(map(str, sizes)) or '(empty)'}: expected a strictly increasing "
                              "list of positive integers, e.g. 1,2,4,8")
        return super().__new__(cls, sizes)

    @property
    def largest(self) -> int:
        """The largest size."""
        return self[-1]

    def position(self, value: int) -> int:
        """Index of the smallest size >= ``value``; ``len(self)`` when ``value`` exceeds the largest."""
        return bisect.bisect_left(self, value)

    def up(self, value: int) -> int | None:
        """The smallest size >= ``value``, or None when ``value`` exceeds the largest."""
        index = bisect.bisect_left(self, value)
        return self[index] if index < len(self) else None

    def up_or_largest(self, value: int) -> int:
        """The smallest size >= ``value``, or the largest when none holds it (the caller splits the rest off)."""
        index = bisect.bisect_left(self, value)
        return self[index] if index < len(self) else self[-1]

    def down(self, value: int) -> int | None:
        """The largest size <= ``value``, or None when ``value`` is below the smallest."""
        index = bisect.bisect_right(self, value)
        return self[index - 1] if index else None

    def above(self, value: int) -> int | None:
        """The smallest size > ``value``, or None when ``value`` is the largest or beyond."""
        index = bisect.bisect_right(self, value)
        return self[index] if index < len(self) else None

    def within(self, captured: Iterable[int], *, name: str, owner: str = "the engine") -> Sizes:
        """``self``, checked to be a subset of the sizes ``owner`` captured (e.g. an engine's CUDA graphs).

        Raises:
            ConfigError: a size ``owner`` has no bucket for; the message names ``name``, the sizes,
                what ``owner`` has and what a size outside it would cost.
        """
        prepared = Sizes(sorted(set(captured)), name=f"sizes {owner} captured")
        missing = [size for size in self if size not in prepared]
        if missing:
            padded = prepared.up(missing[0])
            cost = (f"a batch of {missing[0]} would be padded again to {padded}" if padded is not None
                    else f"a batch of {missing[0]} would have no bucket")
            raise ConfigError(f"config.pbtxt parameter '{name}' = {','.join(map(str, self))}: "
                              f"{', '.join(map(str, missing))} {'is' if len(missing) == 1 else 'are'} not among the sizes "
                              f"{owner} captured ({','.join(map(str, prepared))}), so {cost}; use a subset of them")
        return self


def batch_sizes_of(buckets: Iterable[Bucket]) -> tuple[int, ...]:
    """The distinct batch sizes of ``buckets`` (e.g. an engine's ``buckets``), smallest first."""
    return tuple(sorted({bucket.batch for bucket in buckets}))


def _sorted_sizes(name: str, values: Iterable[int]) -> Sizes:
    values = tuple(values)
    if not values or min(values) < 1:
        raise ConfigError(f"{name} = {values!r}: expected a non-empty list of positive integers")
    return Sizes(sorted(set(int(v) for v in values)), name=name)


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
        rows, columns = self.batch_sizes.up(batch), self.lengths.up(length)
        if rows is None or columns is None:
            return None
        return Bucket(rows, columns)


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
        sides = tuple(sorted(set(int(side) for side in sides_px)))
        bad = [side for side in sides if side < stride_px or side % stride_px]
        if bad:
            raise ConfigError(f"bucket_sides_px = {sides}: {bad} are not positive multiples of {stride_px}")
        self.sides_px: Sizes | tuple[()] = Sizes(sides, name="bucket_sides_px") if sides else ()

    def __repr__(self) -> str:
        return f"ImageSideBuckets(sides_px={self.sides_px})"

    def snap_side(self, side_px: int) -> int:
        """The smallest bucket side >= ``side_px``, or ``side_px`` itself above the largest (or without buckets)."""
        bucket = self.sides_px.up(side_px) if self.sides_px else None
        return side_px if bucket is None else bucket

    def snap(self, shape_hw: tuple[int, int]) -> tuple[int, int]:
        """The (height, width) bucket of a resized image of ``shape_hw``."""
        return self.snap_side(shape_hw[0]), self.snap_side(shape_hw[1])

    def has_graph(self, shape_hw: tuple[int, int]) -> bool:
        """True when both sides of ``shape_hw`` are bucket sides (a graph can serve it)."""
        return shape_hw[0] in self.sides_px and shape_hw[1] in self.sides_px
