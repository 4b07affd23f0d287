"""The files of an ``IMAGE_BYTES`` request: every header read and every limit checked before anything is decoded,
and one error naming every bad element (:class:`ProbedRequest`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from fastpath.errors import InvalidInputError
from fastpath.models.text_detection.image import (
    BYTES_INPUT,
    check_image_count,
    check_image_pixels,
    check_request_pixels,
    decode_encoded,
    probe_encoded,
)

NAMED_ERRORS = 8  # bad elements one error message names (max_images_per_request defaults to 16)
R = TypeVar("R")


@dataclasses.dataclass
class ProbedRequest:
    """The files of an ``IMAGE_BYTES`` request after :func:`probe_request`: each one's (height, width) by its header
    (None where the header could not be read) and the errors found so far, by element index.

    :meth:`decode_each` decodes the rest and raises one error naming every bad element, header and data faults
    alike, so a user who fixes one does not learn of the next only on the next try.
    """

    elements: list[bytes]
    sizes_hw: list[tuple[int, int] | None]
    errors: dict[int, str] = dataclasses.field(default_factory=dict)

    def decode_each(self, decode: Callable[[int, bytes, tuple[int, int]], R]) -> list[R]:
        """``decode(index, data, size_hw)`` for every element whose header was read, in order.

        Raises:
            InvalidInputError: an element failed here or at its header: the one error's message, or "N of M elements
                of input IMAGE_BYTES are bad: ..." with the first :data:`NAMED_ERRORS` of them by index.
        """
        results, errors = [], dict(self.errors)  # the header errors stay as probed: a second call gives the same answer
        for index, (data, size) in enumerate(zip(self.elements, self.sizes_hw)):
            if size is None:
                continue
            try:
                results.append(decode(index, data, size))
            except InvalidInputError as exc:
                errors[index] = str(exc)
        if errors:
            raise InvalidInputError(self.summary(errors))
        return results

    def summary(self, errors: dict[int, str]) -> str:
        """One message for element ``errors`` (index -> message): the one error's, or "N of M elements of input
        IMAGE_BYTES are bad: ..." with the first :data:`NAMED_ERRORS` of them by index."""
        if len(errors) == 1:
            return next(iter(errors.values()))
        named = [errors[index] for index in sorted(errors)[:NAMED_ERRORS]]
        more = f"; and {len(errors) - NAMED_ERRORS} more" if len(errors) > NAMED_ERRORS else ""
        return f"{len(errors)} of {len(self.elements)} elements of input {BYTES_INPUT} are bad: " + "; ".join(named) + more

    def decode(self) -> list[np.ndarray]:
        """Every file decoded on the CPU into uint8 RGB ``[H, W, 3]`` (:func:`decode_encoded`); raises as :meth:`decode_each`."""
        return self.decode_each(lambda index, data, size: decode_encoded(data, index=index, expected_hw=size))


def probe_request(values: np.ndarray, *, max_image_pixels: int, max_request_pixels: int, max_images: int) -> ProbedRequest:
    """The files of an ``IMAGE_BYTES`` tensor (BYTES ``[N]``) and their (height, width) from the headers,
    every limit checked before anything is decoded. A header that cannot be read, or says the image is above
    ``max_image_pixels``, is kept as an error of its element (raised by :meth:`ProbedRequest.decode_each`, with the rest).

    Raises:
        InvalidInputError: no elements, too many, or the readable headers' pixels together above ``max_request_pixels``
            (the message names the elements' own errors too).
    """
    elements = [value if isinstance(value, bytes) else bytes(value) for value in values.reshape(-1)]
    if not elements:
        raise InvalidInputError(f"input {BYTES_INPUT} has shape {list(values.shape)}: no images")
    check_image_count(len(elements), tensor=BYTES_INPUT, max_images=max_images)  # before probing any header
    probed = ProbedRequest(elements, [None] * len(elements))
    for index, data in enumerate(elements):
        try:
            size = probe_encoded(data, index=index, max_image_pixels=max_image_pixels)
            check_image_pixels(index, *size, tensor=BYTES_INPUT, max_image_pixels=max_image_pixels)
            probed.sizes_hw[index] = size
        except InvalidInputError as exc:
            probed.errors[index] = str(exc)
    check_request_pixels(sum(height * width for height, width in filter(None, probed.sizes_hw)), len(elements),
                         tensor=BYTES_INPUT, max_request_pixels=max_request_pixels,
                         also=f"; besides, {probed.summary(probed.errors)}" if probed.errors else "")
    return probed


def images_from_bytes(values: np.ndarray, *, max_image_pixels: int, max_request_pixels: int, max_images: int) -> list[np.ndarray]:
    """Images of an ``IMAGE_BYTES`` tensor: BYTES ``[N]`` (object array of ``bytes``) -> N uint8 RGB ``[H, W, 3]``.

    Every header is read and every limit checked before the first image is decoded (:func:`probe_request`).

    Raises:
        InvalidInputError: an element is not a PNG/JPEG file, is corrupt, or is above a limit.
    """
    return probe_request(values, max_image_pixels=max_image_pixels, max_request_pixels=max_request_pixels,
                         max_images=max_images).decode()
