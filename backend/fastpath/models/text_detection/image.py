"""Turning request tensors into images: limits first, then decode and colour conversion.

Two request forms (see docs/design/text_detection.md):

* ``IMAGE`` UINT8 ``[N, H, W, C]``: N raw images of one size, channels last, C = 1 (grayscale),
  2 (grayscale + alpha), 3 (RGB) or 4 (RGBA).
* ``IMAGE_BYTES`` BYTES ``[N]``: N encoded PNG or JPEG files, each of any size; 8- or 16-bit PNG,
  grayscale, palette, RGB, with or without alpha.

Every image becomes uint8 RGB ``[H, W, 3]`` in the pixel grid it was sent in (JPEG EXIF
orientation is not applied, as in rapidocr): grayscale is replicated to three channels, alpha is
composited over white, 16-bit samples are scaled to 8 bits by ``round(v / 257)``.

Pixel limits are checked on the shapes alone (array shape, or the PNG/JPEG header read by Pillow
without decoding), so an oversized request gets a 400 before any decode or conversion buffer is
allocated.
"""

from __future__ import annotations

import io
import re
import struct
import warnings
from collections.abc import Sequence

import cv2
import numpy as np
from PIL import Image, JpegImagePlugin, PngImagePlugin, UnidentifiedImageError

from fastpath.errors import InvalidInputError

ENCODED_FORMATS = ("PNG", "JPEG")
SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}
# A JPEG decodes straight to RGB (gray and CMYK files too: libjpeg converts them), its EXIF orientation ignored like
# IMREAD_UNCHANGED's: the pixels of IMREAD_UNCHANGED's BGR channel-swapped (tests/unit/models/text_detection/test_image.py),
# one full-image pass fewer (0.89-0.95x the time per photo: docs/benchmarks/detection_decode_cpu.md). PNG keeps
# IMREAD_UNCHANGED for its alpha and 16-bit samples.
JPEG_FLAGS = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
# Pillow's readers, opened directly to learn why a file failed: Image.open hides their error behind
# "cannot identify image file <_io.BytesIO object at 0x...>"
READERS = {"PNG": PngImagePlugin.PngImageFile, "JPEG": JpegImagePlugin.JpegImageFile}
ARRAY_INPUT = "IMAGE"
BYTES_INPUT = "IMAGE_BYTES"
BASE64_SIGNATURES = (b"iVBO", b"/9j/")  # the first 4 base64 characters of a PNG and of a JPEG file
CONVERT_CHUNK_PIXELS = 1 << 18  # 16-bit scaling and alpha compositing run over this many pixels at a time


def check_image_count(count: int, *, tensor: str, max_images: int) -> None:
    """Refuse a request of more than ``max_images`` images (``count``: its input's batch dimension).

    Raises:
        InvalidInputError: naming the tensor, the count and the limit.
    """
    if count > max_images:
        raise InvalidInputError(f"input {tensor} carries {count} images; at most {max_images} are accepted per request "
                                "(config.pbtxt parameter max_images_per_request); split the request")


def check_pixel_limits(sizes_hw: Sequence[tuple[int, int]], *, tensor: str, max_image_pixels: int, max_request_pixels: int,
                       max_images: int) -> None:
    """Refuse a request whose image count or pixel counts exceed the configured limits.

    Args:
        sizes_hw: (height, width) of each image of the request, in pixels.
        tensor: input name for the message.
        max_image_pixels: most height * width of one image.
        max_request_pixels: most height * width summed over the request.
        max_images: most images per request.

    Raises:
        InvalidInputError: naming the image, its size and the limit.
    """
    check_image_count(len(sizes_hw), tensor=tensor, max_images=max_images)
    for index, (height, width) in enumerate(sizes_hw):
        check_image_pixels(index, height, width, tensor=tensor, max_image_pixels=max_image_pixels)
    check_request_pixels(sum(height * width for height, width in sizes_hw), len(sizes_hw), tensor=tensor,
                         max_request_pixels=max_request_pixels)


def check_request_pixels(total: int, count: int, *, tensor: str, max_request_pixels: int, also: str = "") -> None:
    """Refuse a request of ``count`` images and ``total`` pixels above ``max_request_pixels`` (InvalidInputError,
    its message followed by ``also``: what else is wrong with the request)."""
    if total > max_request_pixels:
        raise InvalidInputError(f"input {tensor} carries {total} pixels in {count} images, above the limit of "
                                f"{max_request_pixels} pixels per request (max_request_pixels); split the request{also}")


def check_image_pixels(index: int, height: int, width: int, *, tensor: str, max_image_pixels: int) -> None:
    """Refuse image ``index`` of input ``tensor`` when it is empty or above ``max_image_pixels`` (InvalidInputError)."""
    noun = "element" if tensor == BYTES_INPUT else "image"  # as every other message names an item of that input
    if height <= 0 or width <= 0:
        raise InvalidInputError(f"input {tensor} {noun} {index} is {height}x{width} pixels (height x width); an image needs at least 1x1")
    if height * width > max_image_pixels:
        raise InvalidInputError(f"input {tensor} {noun} {index} is {height}x{width} = {height * width} pixels, above the limit of "
                                f"{max_image_pixels} pixels (config.pbtxt parameter max_image_pixels); downscale it (sizes are height x width)")


def probe_encoded(data: bytes, *, index: int, max_image_pixels: int | None = None) -> tuple[int, int]:
    """(height, width) from a PNG or JPEG header, without decoding the pixels.

    Raises:
        InvalidInputError: the bytes are empty, not a PNG or JPEG file, a PNG/JPEG whose header is
            truncated or corrupt, or one whose header Pillow refuses (above 2 x ``Image.MAX_IMAGE_PIXELS``,
            ~179 Mpx; the message names ``max_image_pixels`` when given).
    """
    if not data:
        raise InvalidInputError(f"input {BYTES_INPUT} element {index} is empty (0 bytes); send an encoded PNG or JPEG file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=ENCODED_FORMATS) as header:
                width, height = header.size
    except Image.DecompressionBombError as exc:  # Pillow refuses headers above 2 x Image.MAX_IMAGE_PIXELS (~179 Mpx)
        limit = f"the limit of {max_image_pixels} pixels (config.pbtxt parameter max_image_pixels)" if max_image_pixels else "any limit"
        said = re.search(r"Image size \((\d+) pixels\)", str(exc))  # Pillow's message carries the header's size
        size = f"{said.group(1)} pixels" if said else f"larger than {2 * Image.MAX_IMAGE_PIXELS} pixels"
        raise InvalidInputError(f"input {BYTES_INPUT} element {index} is {size} by its header, far above {limit}; "
                                "downscale it") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        kind = _kind(data)
        if kind is not None:  # e.g. the first 300 bytes of a JPEG: say what it is, and what its reader said
            reason = decoder_message(data, kind) or str(exc)
            raise InvalidInputError(f"input {BYTES_INPUT} element {index} ({len(data)} bytes) starts like a {kind} file but its "
                                    f"header could not be read ({reason}); the file is corrupt or truncated") from None
        # Pillow's UnidentifiedImageError text names only its internal file object ("<_io.BytesIO object at 0x...>")
        reason = "no PNG or JPEG signature" if isinstance(exc, UnidentifiedImageError) else str(exc)
        if data.lstrip()[:4] in BASE64_SIGNATURES:  # JSON users often send the file base64-encoded
            reason += ("; it looks base64-encoded: send the file's raw bytes (Triton does not decode base64; over HTTP use "
                       "binary data, as tritonclient's binary_data=True does)")
        raise InvalidInputError(f"input {BYTES_INPUT} element {index} ({len(data)} bytes, starting {data[:8]!r}) is not a "
                                f"PNG or JPEG file: {reason}") from None
    return height, width


def _kind(data: bytes) -> str | None:
    """"PNG" or "JPEG" by the file's signature, else None."""
    return next((name for signature, name in SIGNATURES.items() if data.startswith(signature)), None)


def decoder_message(data: bytes, kind: str) -> str:
    """Why Pillow's ``kind`` reader (PNG or JPEG) cannot read ``data``: its header, a chunk checksum
    (PNG), or the pixel data, e.g. "broken PNG file (bad header checksum in b'IDAT')"; "" when it reads it all.

    Called only for a file that already failed, so this second parse costs the served path nothing.
    """
    for step in ("verify", "load"):  # verify checks PNG chunk CRCs, which load skips
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with READERS[kind](io.BytesIO(data)) as image:
                    getattr(image, step)()
        except Exception as exc:  # any of the reader's errors is the answer (SyntaxError, OSError, struct.error, ...)
            text = " ".join(str(exc).split()) or type(exc).__name__
            if text.startswith("unpack_from requires a buffer"):  # struct's words (Pillow re-raises them): out of bytes
                return f"the data ends inside the header, after {len(data)} bytes"
            if text == "not identified by this driver":
                return (png_header_fault(data) if kind == "PNG" else None) or "its header is incomplete or malformed"
            return text
    return ""


_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}  # colour type -> bit depths


def png_header_fault(data: bytes) -> str | None:
    """Which field of a PNG's IHDR chunk breaks the PNG specification (section 11.2.2), or None when none does."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        return f"its first chunk is {data[12:16]!r}, not the 13-byte IHDR header" if len(data) >= 16 else None
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    depth, colour, compression, filtering, interlace = data[24:29]
    for name, value in (("width", width), ("height", height)):
        if not 1 <= value < 2**31:
            return f"its IHDR {name} is {value}; PNG requires 1 to 2^31-1"
    if colour not in _PNG_DEPTHS:
        return f"its IHDR colour type is {colour}; PNG allows 0, 2, 3, 4 or 6"
    if depth not in _PNG_DEPTHS[colour]:
        return f"its IHDR bit depth is {depth}; PNG allows {', '.join(map(str, _PNG_DEPTHS[colour]))} for colour type {colour}"
    for name, value, allowed in (("compression method", compression, (0,)), ("filter method", filtering, (0,)),
                                 ("interlace method", interlace, (0, 1))):
        if value not in allowed:
            return f"its IHDR {name} is {value}; PNG allows {' or '.join(map(str, allowed))}"
    return None


def _row_chunks(height: int, width: int) -> list[slice]:
    """Row ranges of at most ``CONVERT_CHUNK_PIXELS`` pixels (one row at least), covering ``height`` rows."""
    rows = max(1, CONVERT_CHUNK_PIXELS // width)
    return [slice(start, start + rows) for start in range(0, height, rows)]


def _scale_16_to_8(samples: np.ndarray) -> np.ndarray:
    """uint16 -> uint8 by round(v / 257), which maps 0..65535 onto 0..255 exactly at both ends.

    Computed in row chunks, so the uint32 scratch is bounded by ``CONVERT_CHUNK_PIXELS``, not the image.
    """
    out = np.empty(samples.shape, np.uint8)
    for rows in _row_chunks(samples.shape[0], samples.shape[1]):
        wide = samples[rows].astype(np.uint32)
        wide += 128
        wide //= 257
        out[rows] = wide
    return out


def _over_white(color: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Composite uint8 ``color`` [H, W, C] with uint8 ``alpha`` [H, W] over a white background.

    Computed in row chunks, so the uint16 scratch is bounded by ``CONVERT_CHUNK_PIXELS``, not the image.
    """
    out = np.empty(color.shape, np.uint8)
    for rows in _row_chunks(color.shape[0], color.shape[1]):
        a = alpha[rows].astype(np.uint16)[..., None]
        out[rows] = (color[rows].astype(np.uint16) * a + 255 * (255 - a) + 127) // 255
    return out


def to_rgb8(image: np.ndarray, *, channel_order: str, where: str) -> np.ndarray:
    """Convert one image to contiguous uint8 RGB ``[H, W, 3]``.

    Args:
        image: uint8 or uint16, ``[H, W]`` or ``[H, W, C]`` with C in 1..4. Channels are gray,
            gray+alpha, colour, colour+alpha.
        channel_order: ``"rgb"`` (request tensors) or ``"bgr"`` (OpenCV's decoder output).
        where: what the image is, for error messages (e.g. ``"input IMAGE image 2"``).

    Raises:
        InvalidInputError: unsupported dtype, rank or channel count, or a zero-sized dimension.
    """
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[2] not in (1, 2, 3, 4):
        raise InvalidInputError(f"{where} has shape {list(image.shape)}; expected [H, W] or [H, W, C] with C = 1 (gray), "
                                "2 (gray+alpha), 3 (RGB) or 4 (RGBA)")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise InvalidInputError(f"{where} has shape {list(image.shape)} with a zero-sized dimension")
    if image.dtype == np.uint16:
        image = _scale_16_to_8(image)
    elif image.dtype != np.uint8:
        raise InvalidInputError(f"{where} has dtype {image.dtype}; expected uint8 (or 16-bit PNG bytes)")
    channels = image.shape[2]
    if channels == 3 and channel_order == "bgr":  # OpenCV's channel swap: numpy's copy of a reversed view is ~80x slower
        return cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_BGR2RGB)
    if channels == 1:
        return cv2.cvtColor(np.ascontiguousarray(image[..., 0]), cv2.COLOR_GRAY2RGB)
    color = image[..., :1] if channels <= 2 else image[..., :3]
    if channels >= 3 and channel_order == "bgr":
        color = color[..., ::-1]
    if channels in (2, 4):
        color = _over_white(color, image[..., -1])
    if color.shape[2] == 1:
        color = np.repeat(color, 3, axis=2)
    return np.ascontiguousarray(color)


def images_from_array(batch: np.ndarray, *, max_image_pixels: int, max_request_pixels: int, max_images: int) -> list[np.ndarray]:
    """Images of an ``IMAGE`` tensor: uint8 ``[N, H, W, C]`` -> N uint8 RGB ``[H, W, 3]``, the shape checked first
    (:func:`check_array`).

    Raises:
        InvalidInputError: wrong rank or channel count; zero-sized; above a limit.
    """
    check_array(batch, max_image_pixels=max_image_pixels, max_request_pixels=max_request_pixels, max_images=max_images)
    return [to_rgb8(batch[i], channel_order="rgb", where=f"input {ARRAY_INPUT} image {i}") for i in range(batch.shape[0])]


def check_array(batch: np.ndarray, *, max_image_pixels: int, max_request_pixels: int, max_images: int) -> None:
    """Check an ``IMAGE`` tensor's shape (uint8 ``[N, H, W, C]``, C = 1-4) against the limits, reading no pixel;
    raises InvalidInputError: wrong rank or channel count, zero-sized, above a limit."""
    if batch.ndim != 4:
        raise InvalidInputError(f"input {ARRAY_INPUT} has shape {list(batch.shape)}; expected [N, H, W, C] (uint8, channels last)")
    count, height, width, channels = batch.shape
    if channels not in (1, 2, 3, 4):
        raise InvalidInputError(f"input {ARRAY_INPUT} has shape {list(batch.shape)}; expected [N, H, W, C] with C = 1 (gray), "
                                "2 (gray+alpha), 3 (RGB) or 4 (RGBA)")
    if count == 0:
        raise InvalidInputError(f"input {ARRAY_INPUT} has shape {list(batch.shape)}: no images (N = 0)")
    check_pixel_limits([(height, width)] * count, tensor=ARRAY_INPUT, max_image_pixels=max_image_pixels,
                       max_request_pixels=max_request_pixels, max_images=max_images)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Ancillary PNG chunks dropped before decoding: colour profiles the detector never uses, and that
# libpng checks and complains about on stderr ("libpng warning: iCCP: known incorrect sRGB profile"),
# once per decoded image, into Triton's log.
UNUSED_PNG_CHUNKS = (b"iCCP",)


def without_unused_png_chunks(data: bytes) -> bytes:
    """``data`` with the chunks in :data:`UNUSED_PNG_CHUNKS` removed (PNG only; anything else unchanged).

    Walks the chunk headers (PNG spec 5.3: 4-byte length, 4-byte type, data, 4-byte CRC) up to the
    first ``IDAT``; a chunk list that does not parse is left as it is for the decoder to judge.
    """
    if not data.startswith(PNG_SIGNATURE):
        return data
    kept, start, offset = [], 0, len(PNG_SIGNATURE)
    while offset + 8 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        kind = data[offset + 4:offset + 8]
        end = offset + 12 + length
        if kind == b"IDAT" or end > len(data):
            break
        if kind in UNUSED_PNG_CHUNKS:
            kept.append(data[start:offset])
            start = end
        offset = end
    return data if start == 0 else b"".join(kept) + data[start:]


def decode_encoded(data: bytes, *, index: int, expected_hw: tuple[int, int]) -> np.ndarray:
    """Decode one PNG/JPEG file (already probed) into uint8 RGB ``[H, W, 3]``.

    Raises:
        InvalidInputError: the file is corrupt or truncated, or decodes to another size than its header says.
    """
    jpeg = _kind(data) == "JPEG"
    decoded = cv2.imdecode(np.frombuffer(without_unused_png_chunks(data), dtype=np.uint8), JPEG_FLAGS if jpeg else cv2.IMREAD_UNCHANGED)
    where = f"input {BYTES_INPUT} element {index}"
    if decoded is None:
        kind = _kind(data)
        reason = (decoder_message(data, kind) if kind else "") or "OpenCV's decoder refused the pixel data"
        raise InvalidInputError(f"{where} ({len(data)} bytes) has a valid header but could not be decoded ({reason}); "
                                "the file is corrupt or truncated")
    if decoded.shape[:2] != expected_hw:
        raise InvalidInputError(f"{where} decoded to {decoded.shape[0]}x{decoded.shape[1]} pixels but its header says "
                                f"{expected_hw[0]}x{expected_hw[1]}; the file is corrupt")
    return decoded if jpeg else to_rgb8(decoded, channel_order="bgr", where=where)
