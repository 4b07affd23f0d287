"""``detect_text`` requests and results, planned from the model's config as the server reports it.

The text-detection model takes raw pixels (a ``UINT8`` input, channels last) and/or
encoded PNG/JPEG bytes (a ``BYTES`` input), and answers boxes (an output whose dims end in ``[4, 2]``:
quadrilaterals in pixel coordinates of the input image), scores (another ``FP32`` output) and possibly
boxes-per-image counts (an ``INT*`` output named ``*COUNT*``, for ragged batches). The
client finds these tensors in ``get_model_config`` rather than hard-coding names, and sends one image
per request (images of different sizes do not stack); the async client sends them concurrently.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from fastpath_client.errors import InvalidInputError, ServerError
from fastpath_client.tensors import ModelSpec, TensorSpec

# The channel counts a text detector's UINT8 input takes (text_detection's IMAGE, docs/models.md): gray,
# gray + alpha, RGB, RGBA.
IMAGE_CHANNELS = (1, 2, 3, 4)


@dataclasses.dataclass(frozen=True)
class Detection:
    """Text found in one image.

    Attributes:
        boxes: float32 [K, 4, 2], the corners (x, y) of each quadrilateral in pixels of the input image.
        scores: float32 [K], confidence of each box.
    """

    boxes: np.ndarray
    scores: np.ndarray


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectionIO:
    """Which tensors of the detection model carry what.

    Attributes:
        pixels: the UINT8 image input, or None.
        encoded: the BYTES (encoded image) input, or None.
        boxes: output name of the boxes.
        scores: output name of the scores.
        counts: output name of the boxes-per-image counts (ragged batches), or None.
    """

    pixels: TensorSpec | None
    encoded: TensorSpec | None
    boxes: str
    scores: str
    counts: str | None = None

    @property
    def outputs(self) -> list[str]:
        """The outputs to request."""
        return [self.boxes, self.scores] + ([self.counts] if self.counts else [])


def detection_io(spec: ModelSpec) -> DetectionIO:
    """Find the image input(s) and the boxes/scores outputs in ``spec``.

    Raises:
        InvalidInputError: the model has no UINT8/BYTES input, or no ``[..., 4, 2]`` boxes output and
            FP32 scores output (the message lists the model's tensors).
    """
    pixels = next((t for t in spec.inputs if t.datatype == "UINT8"), None)
    encoded = next((t for t in spec.inputs if t.datatype == "BYTES"), None)
    boxes = next((t for t in spec.outputs if t.dims[-2:] == (4, 2)), None)
    scores = [t for t in spec.outputs if t.datatype == "FP32" and t is not boxes]
    score = next((t for t in scores if "SCORE" in t.name.upper()), scores[0] if scores else None)
    if (pixels is None and encoded is None) or boxes is None or score is None:
        listing = [f"{t.name} {t.datatype} {list(t.dims)}" for t in spec.inputs + spec.outputs]
        raise InvalidInputError(f"model '{spec.name}' does not look like a text detector (want a UINT8 or BYTES "
                                f"image input, a [..., 4, 2] boxes output and an FP32 scores output); it has {listing}")
    counts = next((t.name for t in spec.outputs if t.datatype.startswith("INT") and "COUNT" in t.name.upper()), None)
    return DetectionIO(pixels=pixels, encoded=encoded, boxes=boxes.name, scores=score.name, counts=counts)


def _shape_for(spec: ModelSpec, tensor: TensorSpec, item_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Request shape for one item: a leading 1 when the model batches or its dims have one more axis."""
    rank = len(spec.full_dims(tensor))
    return (1,) * (rank - len(item_shape)) + item_shape


def check_image_list(images: Any) -> None:
    """Refuse one image passed where a sequence of images is expected (``detect_text(image)``).

    Iterating an HxWx3 array yields its H rows, each a Wx3 "grayscale image", and iterating bytes yields
    ints: either would send the wrong requests, so both are refused. An NxHxWx3 array is N images.

    Raises:
        InvalidInputError: ``images`` is a single encoded file (bytes) or a 2-D/3-D array.
    """
    if isinstance(images, (bytes, bytearray, memoryview, str, os.PathLike)):
        raise InvalidInputError(f"images: expected a sequence of images, got a single {type(images).__name__}; "
                                "wrap it in a list: detect_text([image])")
    if isinstance(images, np.ndarray) and images.ndim in (2, 3):
        raise InvalidInputError(f"images: expected a sequence of images, got one array of shape {list(images.shape)} "
                                "(one HxWx3 or HxW image); wrap it in a list: detect_text([image]) "
                                "(an NxHxWx3 array is taken as N images)")


def image_request(io: DetectionIO, spec: ModelSpec, image: Any, index: int) -> dict[str, np.ndarray]:
    """The inputs of one request for ``image`` (an HxWxC uint8 array, C in :data:`IMAGE_CHANNELS`, or HxW
    grayscale; or encoded PNG/JPEG bytes).

    Raises:
        InvalidInputError: the model cannot take this kind of image, or the array's dtype, rank, size (H or W
            of 0) or channels are wrong or differ from the config's fixed dims (the message names the image
            index, what came and what is expected).
    """
    if isinstance(image, (bytes, bytearray, memoryview)):
        if io.encoded is None:
            raise InvalidInputError(f"image {index}: model '{spec.name}' takes raw UINT8 pixels ({io.pixels.name}), "
                                    "not encoded bytes; decode first, e.g. np.asarray(PIL.Image.open(f).convert('RGB'))")
        item = np.empty(_shape_for(spec, io.encoded, (1,)), dtype=np.object_)
        item.reshape(-1)[0] = bytes(image)
        return {io.encoded.name: item}
    if isinstance(image, (str, os.PathLike)):  # a file name: numpy's "dtype <U8" would tell the caller nothing
        raise InvalidInputError(f"image {index} is a file name ({str(image)!r}), not an image: pass its bytes, "
                                "e.g. pathlib.Path(name).read_bytes(), or an HxWx3 uint8 array")
    if image is None or isinstance(image, (int, float)):  # np.asarray would make a 0-d array of it
        raise InvalidInputError(f"image {index} is {image!r}, not an image: pass an HxWx3 uint8 array or the "
                                "bytes of a PNG/JPEG file")
    array = np.asarray(image)
    if array.ndim not in (2, 3):  # sent anyway, the server's 400 would name a reshaped [1, 1, 5] the caller never made
        raise InvalidInputError(f"image {index}: shape {list(array.shape)} has {array.ndim} dimensions; expected HxWx3 RGB "
                                "(or HxW grayscale), one image per list item")
    if io.pixels is None:
        raise InvalidInputError(f"image {index}: model '{spec.name}' takes encoded PNG/JPEG bytes "
                                f"({io.encoded.name}); encode the array first")
    if array.ndim == 2:  # grayscale HxW: one channel, for models that take C=1
        array = array[..., np.newaxis]
    if array.dtype != np.uint8:
        raise InvalidInputError(f"image {index}: dtype {array.dtype}, expected uint8 (HxWxC, C = 1, 2, 3 or 4, or HxW grayscale)")
    height, width, channels = array.shape
    if height < 1 or width < 1 or channels not in IMAGE_CHANNELS:  # refused here, before any image is sent
        raise InvalidInputError(f"image {index}: shape {list(array.shape)}; expected HxWxC with H, W >= 1 and C = 1 (gray), "
                                "2 (gray + alpha), 3 (RGB) or 4 (RGBA), or HxW grayscale")
    shape = _shape_for(spec, io.pixels, array.shape)
    dims = spec.full_dims(io.pixels)
    if len(shape) != len(dims) or any(d not in (-1, s) for d, s in zip(dims, shape)):
        raise InvalidInputError(f"image {index}: shape {list(array.shape)} does not fit input {io.pixels.name} "
                                f"dims {list(dims)} of model '{spec.name}' (expected HxWxC uint8)")
    return {io.pixels.name: np.ascontiguousarray(array).reshape(shape)}


def parse_detection(io: DetectionIO, model: str, outputs: dict[str, np.ndarray]) -> Detection:
    """One :class:`Detection` from one response's outputs.

    Raises:
        ServerError: the numbers of boxes and scores (and the count output, if any) differ.
    """
    boxes = np.asarray(outputs[io.boxes], dtype=np.float32).reshape(-1, 4, 2)
    scores = np.asarray(outputs[io.scores], dtype=np.float32).reshape(-1)
    if len(boxes) != len(scores):
        raise ServerError(f"model '{model}' returned {len(boxes)} boxes but {len(scores)} scores")
    if io.counts is not None and io.counts in outputs and outputs[io.counts].reshape(-1).tolist() != [len(boxes)]:
        raise ServerError(f"model '{model}' returned {len(boxes)} boxes for one image but "
                          f"{io.counts}={outputs[io.counts].reshape(-1).tolist()}")
    return Detection(boxes=boxes, scores=scores)
