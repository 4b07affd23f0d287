"""Host-side staging of a batch into a bucket's static input rows.

A batch of ``n`` sequences of ``l`` tokens is written into a ``[bucket.batch, bucket.length]``
array: real rows first, each padded on the right with the input's pad value, then filler rows up
to the bucket's batch size. Filler rows hold valid data (a real, empty sequence such as
``[CLS] [SEP]`` with its attention mask), never garbage or an all-zero mask: a fully masked
attention row is NaN in softmax, and NaN can leak through fused kernels. Filler rows are never
returned, so a row's result does not depend on its batch neighbours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastpath.errors import EngineError


@dataclasses.dataclass(frozen=True)
class PaddedInput:
    """How one integer input of a sequence model is padded.

    Attributes:
        name: input name, e.g. ``"input_ids"``.
        pad_value: value of padding positions (right of each sequence), e.g. 0 for BERT ids and masks.
        filler: the start of a filler row (the rest is ``pad_value``), e.g. ``(101, 102)``
            ([CLS] [SEP]) for ``input_ids`` and ``(1, 1)`` for ``attention_mask``.
    """

    name: str
    pad_value: int = 0
    filler: tuple[int, ...] = ()


# all-MiniLM-L6-v2 / BERT WordPiece: filler rows are the empty text "" -> [CLS] [SEP] (ids 101, 102)
BERT_INPUTS = (
    PaddedInput("input_ids", 0, (101, 102)),
    PaddedInput("attention_mask", 0, (1, 1)),
    PaddedInput("token_type_ids", 0, ()),
)


def batch_shape(feeds: Mapping[str, np.ndarray], inputs: tuple[PaddedInput, ...]) -> tuple[int, int]:
    """The common ``(batch, length)`` of the named 2-D integer inputs.

    Raises:
        EngineError: an input is missing, not 2-D, not an integer array, or its shape differs
            from the first input's.
    """
    if not inputs:
        raise EngineError("no inputs declared for this engine")
    shape: tuple[int, ...] = ()
    for spec in inputs:
        array = feeds.get(spec.name)
        if array is None:
            raise EngineError(f"input {spec.name!r} is missing; got {sorted(feeds)}")
        if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
            raise EngineError(f"input {spec.name!r} has dtype {array.dtype} and shape {array.shape}; expected a 2-D integer array [batch, tokens]")
        if not shape:
            shape = array.shape
        elif array.shape != shape:
            raise EngineError(f"input {spec.name!r} has shape {array.shape}; {inputs[0].name!r} has {shape}: all inputs must match")
    return shape[0], shape[1]


def stage_rows(dest: np.ndarray, source: np.ndarray, spec: PaddedInput) -> None:
    """Write ``source`` [n, l] into ``dest`` [B, L] (B >= n, L >= l), padding and filling the rest.

    Args:
        dest: the bucket's staging view for this input, shape [B, L].
        source: the batch's values, shape [n, l].
        spec: pad value and filler row of this input.

    Raises:
        EngineError: ``source`` does not fit ``dest``, or the filler row is longer than ``L``.
    """
    rows, columns = source.shape
    if rows > dest.shape[0] or columns > dest.shape[1]:
        raise EngineError(f"input {spec.name!r} of shape {source.shape} does not fit the bucket {dest.shape}")
    if len(spec.filler) > dest.shape[1]:
        raise EngineError(f"filler row of {spec.name!r} has {len(spec.filler)} tokens; the bucket length is {dest.shape[1]}")
    dest[:rows, :columns] = source
    dest[:rows, columns:] = spec.pad_value
    if rows < dest.shape[0]:
        dest[rows:, :] = spec.pad_value
        dest[rows:, : len(spec.filler)] = spec.filler


def filler_rows(batch: int, length: int, spec: PaddedInput, dtype: np.dtype = np.dtype(np.int64)) -> np.ndarray:
    """``batch`` filler rows of ``length`` tokens (valid data for warm-up, capture and padding)."""
    rows = np.full((batch, length), spec.pad_value, dtype=dtype)
    rows[:, : len(spec.filler)] = spec.filler
    return rows


class PackedFeeds(dict):
    """Feeds that are the slabs of one int64 [num_inputs, rows, length] block, in input order (``names``).

    What :class:`~fastpath.models.text_embedding.batches.EmbeddingBatchHandler` stages into a staging-pool lease: the
    block travels with its slabs, so :func:`packed_inputs` hands it to the one host-to-device copy without proving
    from addresses that the slabs tile it (three ``ctypes`` lookups and a strided view: ~10-30 us per call).

    Attributes:
        block: the [num_inputs, rows, length] array.
        parts: ``block[k]`` for each name, the very arrays stored under the names (replacing one breaks the match).
    """

    __slots__ = ("block", "parts")

    def __init__(self, block: np.ndarray, names: tuple[str, ...]) -> None:
        parts = tuple(block[index] for index in range(len(names)))
        super().__init__(zip(names, parts))
        self.block, self.parts = block, parts


def packed_inputs(feeds: Mapping[str, np.ndarray], inputs: tuple[PaddedInput, ...], bucket: Any) -> np.ndarray | None:
    """The feeds as one int64 [num_inputs, b, L] array without copying, or None if they are not one block.

    They are one block when every input is a C-contiguous int64 array of exactly the bucket's shape
    ``(bucket.batch, bucket.length)`` and input ``k`` starts where input ``k - 1`` ends, in the
    order of ``inputs``: :class:`PackedFeeds` whose slabs are still the ones stored (their block, at once),
    or arrays whose addresses show it. The latter returns a strided view spanning the arrays' memory,
    which is valid because they tile it exactly; nothing is copied, and nothing writes through it.
    """
    block = getattr(feeds, "block", None)
    if (block is not None and block.shape == (len(inputs), bucket.batch, bucket.length) and block.dtype == np.int64
            and block.flags.c_contiguous and all(feeds.get(spec.name) is part for spec, part in zip(inputs, feeds.parts))):
        return block
    arrays = [feeds.get(spec.name) for spec in inputs]
    shape = (bucket.batch, bucket.length)
    first = arrays[0]
    if first is None:
        return None
    for index, array in enumerate(arrays):
        if (array is None or array.shape != shape or array.dtype != np.int64 or not array.flags.c_contiguous
                or array.ctypes.data != first.ctypes.data + index * first.nbytes):
            return None
    return np.lib.stride_tricks.as_strided(first, shape=(len(arrays), *shape), strides=(first.nbytes, *first.strides))
