"""Request images -> uint8 RGB: conversions, decoding, limits before allocation."""

import io
import re
from unittest import mock

import cv2
import numpy as np
import pytest
from PIL import Image

from fastpath.errors import InvalidInputError
from fastpath.models.text_detection import image as image_module
from fastpath.models.text_detection import probe as probe_module
from fastpath.models.text_detection.image import images_from_array, probe_encoded, to_rgb8
from fastpath.models.text_detection.probe import images_from_bytes
from tests.unit.models.text_detection.reference import (
    blank_png,
    jpeg_bytes,
    png_bytes,
    skimage_path,
    skimage_rgb,
    with_broken_crc,
)

LIMITS = {"max_image_pixels": 8192 * 8192, "max_request_pixels": 8192 * 8192, "max_images": 16}


@pytest.fixture(scope="module")
def coffee():
    return skimage_rgb("coffee.png")


def test_rgb_is_returned_unchanged_and_contiguous(coffee):
    out = to_rgb8(coffee, channel_order="rgb", where="t")
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, coffee)


def test_bgr_is_reversed(coffee):
    np.testing.assert_array_equal(to_rgb8(np.ascontiguousarray(coffee[..., ::-1]), channel_order="bgr", where="t"), coffee)


@pytest.mark.parametrize("shape", [(40, 30), (40, 30, 1)])
def test_grayscale_is_replicated(shape):
    gray = np.arange(40 * 30, dtype=np.uint32).reshape(shape).astype(np.uint8)
    out = to_rgb8(gray, channel_order="rgb", where="t")
    assert out.shape == (40, 30, 3)
    for channel in range(3):
        np.testing.assert_array_equal(out[..., channel], gray.reshape(40, 30))


def test_alpha_is_composited_over_white(coffee):
    opaque = np.concatenate([coffee, np.full(coffee.shape[:2] + (1,), 255, np.uint8)], axis=2)
    np.testing.assert_array_equal(to_rgb8(opaque, channel_order="rgb", where="t"), coffee)
    transparent = opaque.copy()
    transparent[..., 3] = 0
    assert (to_rgb8(transparent, channel_order="rgb", where="t") == 255).all()
    half = np.array([[[0, 100, 255, 128]]], dtype=np.uint8)  # 0*128/255 + 255*127/255 = 127 ...
    np.testing.assert_array_equal(to_rgb8(half, channel_order="rgb", where="t")[0, 0], [127, 177, 255])
    gray_alpha = np.array([[[0, 128]]], dtype=np.uint8)
    np.testing.assert_array_equal(to_rgb8(gray_alpha, channel_order="rgb", where="t")[0, 0], [127, 127, 127])


def test_sixteen_bit_is_scaled_by_257():
    samples = np.array([[0, 128, 129, 257 * 100, 65535]], dtype=np.uint16)
    assert to_rgb8(samples, channel_order="rgb", where="t")[0, :, 0].tolist() == [0, 0, 1, 100, 255]


def test_conversions_of_images_larger_than_a_chunk_equal_the_whole_image_formula_with_bounded_scratch():
    """16-bit BGRA over several row chunks (with a last partial one): the result equals round(v / 257) then
    alpha over white computed on the whole image at once, and the conversion allocates at most the
    8-bit copy (4 B/px), the RGB result (3 B/px) and one chunk's scratch (48 B/px of CONVERT_CHUNK_PIXELS)."""
    import tracemalloc

    height, width = 2 * image_module.CONVERT_CHUNK_PIXELS // 1000 + 7, 1000
    image = np.random.default_rng(3).integers(0, 65536, (height, width, 4), dtype=np.uint16)
    scaled = ((image.astype(np.uint32) + 128) // 257).astype(np.uint16)
    alpha = scaled[..., 3:]
    expected = ((scaled[..., 2::-1] * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)
    tracemalloc.start()
    try:
        out = to_rgb8(image, channel_order="bgr", where="t")
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, expected)
    assert peak_bytes <= height * width * (4 + 3) + image_module.CONVERT_CHUNK_PIXELS * 48


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.zeros((4, 4, 5), np.uint8), r"has shape \[4, 4, 5\]; expected .*C = 1"),
        (np.zeros((4, 4, 3), np.float32), "dtype float32; expected uint8"),
        (np.zeros((0, 4, 3), np.uint8), "zero-sized"),
        (np.zeros((2, 2, 2, 3), np.uint8), "expected"),
    ],
)
def test_unsupported_images_are_refused(array, match):
    with pytest.raises(InvalidInputError, match=match):
        to_rgb8(array, channel_order="rgb", where="input IMAGE image 0")


def test_an_image_tensor_with_five_channels_is_refused_in_its_own_layout():
    """Invariant: the IMAGE tensor's error shows its [N, H, W, C] shape and layout, not one image's [H, W, C]."""
    with pytest.raises(InvalidInputError, match=r"input IMAGE has shape \[2, 4, 4, 5\]; expected \[N, H, W, C\] with C = 1 \(gray\)"):
        images_from_array(np.zeros((2, 4, 4, 5), np.uint8), **LIMITS)


def test_array_batch_gives_one_image_per_row(coffee):
    batch = np.stack([coffee, coffee[::-1]])
    images = images_from_array(batch, **LIMITS)
    assert len(images) == 2
    np.testing.assert_array_equal(images[1], coffee[::-1])


@pytest.mark.parametrize(
    ("shape", "match"),
    [((8, 8, 3), r"expected \[N, H, W, C\]"), ((0, 8, 8, 3), "no images"), ((1, 0, 0, 3), "at least 1x1")],
)
def test_array_shape_errors(shape, match):
    with pytest.raises(InvalidInputError, match=match):
        images_from_array(np.zeros(shape, np.uint8), **LIMITS)


def test_array_limits_are_checked_on_the_shape_before_any_conversion():
    # 9000x9000x3 virtual pixels, no memory behind them: converting would allocate 243 MB
    huge = np.broadcast_to(np.zeros((1, 1, 1, 3), np.uint8), (1, 9000, 9000, 3))
    with mock.patch.object(image_module, "to_rgb8", wraps=image_module.to_rgb8) as convert:
        with pytest.raises(InvalidInputError, match=r"9000x9000 = 81000000 pixels, above the limit of 67108864"):
            images_from_array(huge, **LIMITS)
    assert convert.call_count == 0
    with pytest.raises(InvalidInputError, match="carries 17 images; at most 16"):
        images_from_array(np.broadcast_to(np.zeros((1, 1, 1, 3), np.uint8), (17, 8, 8, 3)), **LIMITS)
    with pytest.raises(InvalidInputError, match="81000000 pixels in 9 images, above the limit of 67108864 pixels per request"):
        images_from_array(np.broadcast_to(np.zeros((1, 1, 1, 3), np.uint8), (9, 3000, 3000, 3)), **LIMITS)


def test_png_round_trip_is_exact_for_gray_rgb_rgba_and_16_bit(coffee):
    gray = skimage_rgb("page.png")[..., 0]
    rgba = np.concatenate([coffee, np.full(coffee.shape[:2] + (1,), 255, np.uint8)], axis=2)
    encoded = np.array([png_bytes(coffee), png_bytes(gray), png_bytes(rgba), png_bytes(gray.astype(np.uint16) * 257)], dtype=object)
    images = images_from_bytes(encoded, **LIMITS)
    np.testing.assert_array_equal(images[0], coffee)
    np.testing.assert_array_equal(images[1], np.repeat(gray[..., None], 3, axis=2))
    np.testing.assert_array_equal(images[2], coffee)
    np.testing.assert_array_equal(images[3], images[1])


def test_shipped_png_and_jpeg_files_decode():
    files = np.array([skimage_path("page.png").read_bytes(), skimage_path("rocket.jpg").read_bytes()], dtype=object)
    page, rocket = images_from_bytes(files, **LIMITS)
    assert page.shape == (191, 384, 3) and rocket.shape == (427, 640, 3)
    np.testing.assert_array_equal(page, skimage_rgb("page.png"))
    assert np.abs(rocket.astype(int) - skimage_rgb("rocket.jpg").astype(int)).mean() < 1.0  # two JPEG decoders


def test_jpeg_round_trip_is_close(coffee):
    (decoded,) = images_from_bytes(np.array([jpeg_bytes(coffee)], dtype=object), **LIMITS)
    assert decoded.shape == coffee.shape
    assert np.abs(decoded.astype(int) - coffee.astype(int)).mean() < 3.0


@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK", "RGB rotated by EXIF"])
def test_a_jpeg_decodes_to_the_pixels_of_opencvs_unchanged_decode_as_rgb_with_exif_orientation_ignored(coffee, mode):
    """JPEGs decode straight to RGB (image.JPEG_FLAGS). Invariant: the pixels equal IMREAD_UNCHANGED's (BGR, or gray
    replicated) converted to RGB exactly, for colour, gray and CMYK files, and an EXIF orientation tag (6: rotate 90)
    leaves the stored pixels and their size as they are, as IMREAD_UNCHANGED does."""
    buffer = io.BytesIO()
    picture = Image.fromarray(coffee[:120, :200])
    if mode == "RGB rotated by EXIF":
        exif = picture.getexif()
        exif[0x0112] = 6
        picture.save(buffer, "JPEG", exif=exif)
    else:
        picture.convert(mode).save(buffer, "JPEG")
    data = buffer.getvalue()
    (decoded,) = images_from_bytes(np.array([data], dtype=object), **LIMITS)
    unchanged = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    expected = cv2.cvtColor(unchanged, cv2.COLOR_GRAY2RGB if unchanged.ndim == 2 else cv2.COLOR_BGR2RGB)
    assert decoded.shape == (120, 200, 3) and decoded.dtype == np.uint8 and decoded.flags.c_contiguous
    np.testing.assert_array_equal(decoded, expected)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", r"element 0 is empty \(0 bytes\)"),
        (b"hello world", "is not a PNG or JPEG file"),
        (b"GIF89a" + b"\x00" * 64, "is not a PNG or JPEG file: no PNG or JPEG signature$"),
        # a base64-encoded PNG and JPEG (what JSON users often send) are named as such
        (b"iVBORw0KGgoAAAANSUhEUg==", "no PNG or JPEG signature; it looks base64-encoded: send the file's raw bytes"),
        (b"/9j/4AAQSkZJRgABAQ==", "no PNG or JPEG signature; it looks base64-encoded"),
    ],
)
def test_not_an_image_is_refused(data, match):
    with pytest.raises(InvalidInputError, match=match) as info:
        images_from_bytes(np.array([data], dtype=object), **LIMITS)
    assert "BytesIO" not in str(info.value)  # no Pillow-internal object repr in a client's error


def test_one_error_names_every_bad_element_of_a_request_header_and_decode_faults_alike(coffee):
    """Invariant: a request with several bad files gets one 400 that names each bad element by index (a header
    that cannot be read, data cut short), in order, so a user fixing them learns of all at once; with more than
    probe.NAMED_ERRORS bad elements the rest are counted."""
    jpeg = jpeg_bytes(coffee)
    files = [jpeg, jpeg, jpeg, jpeg[: len(jpeg) // 2], jpeg, jpeg, b"\xff\xd8\xff" + b"x" * 50]
    with pytest.raises(InvalidInputError) as info:
        images_from_bytes(np.array(files, dtype=object), **LIMITS)
    message = str(info.value)
    assert message.startswith("2 of 7 elements of input IMAGE_BYTES are bad: ")
    assert message.index("element 3 (") < message.index("element 6 (")
    assert "header could not be read" in message and "could not be decoded" in message
    for bad in ([b""] * 2, [b"GIF89a"] * 10):
        with pytest.raises(InvalidInputError) as info:
            images_from_bytes(np.array([jpeg, *bad], dtype=object), **LIMITS)
        assert str(info.value).startswith(f"{len(bad)} of {len(bad) + 1} elements of input IMAGE_BYTES are bad: ")
        assert str(info.value).endswith("; and 2 more" if len(bad) == 10 else "send an encoded PNG or JPEG file")
    (alone,) = [jpeg[: len(jpeg) // 2]]
    with pytest.raises(InvalidInputError, match=r"^input IMAGE_BYTES element 0 \("):  # one bad element: its own message
        images_from_bytes(np.array([alone], dtype=object), **LIMITS)


def test_damage_libjpeg_recovers_from_decodes_as_recovered_at_the_headers_size(coffee):
    """The policy for damage inside a JPEG's compressed data (markers intact): libjpeg recovers (it logs "Corrupt
    JPEG data") and FastPath serves the recovered pixels, as Pillow and browsers show them; OpenCV does not report
    libjpeg's warnings, so no 400 can come from them. Invariant: the result has the header's size and equals
    OpenCV's own decode of the damaged file; a file cut short is refused (test above)."""
    jpeg = bytearray(jpeg_bytes(coffee))
    start = jpeg.index(b"\xff\xda") + 200  # inside the entropy-coded data of the scan
    jpeg[start:start + 64] = bytes(range(0, 128, 2))  # no 0xff, so no marker is made or removed
    (decoded,) = images_from_bytes(np.array([bytes(jpeg)], dtype=object), **LIMITS)
    assert decoded.shape == coffee.shape
    np.testing.assert_array_equal(decoded, cv2.imdecode(np.frombuffer(bytes(jpeg), np.uint8), image_module.JPEG_FLAGS))


def test_gif_from_skimage_is_refused():
    gif = skimage_path("no_time_for_that_tiny.gif").read_bytes()
    with pytest.raises(InvalidInputError, match="not a PNG or JPEG"):
        images_from_bytes(np.array([gif], dtype=object), **LIMITS)


def test_truncated_png_is_refused_as_corrupt(coffee):
    truncated = png_bytes(coffee)[:2000]
    with pytest.raises(InvalidInputError, match=r"could not be decoded \(Truncated File Read\); the file is corrupt or truncated"):
        images_from_bytes(np.array([truncated], dtype=object), **LIMITS)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda png, jpeg: png[:40], r"starts like a PNG file but its header could not be read \(broken PNG file \(chunk b'IDA'\)\)"),
    (lambda png, jpeg: with_broken_crc(png, b"IHDR"),
     r"starts like a PNG file but its header could not be read \(broken PNG file \(bad header checksum in b'IHDR'\)\)"),
    (lambda png, jpeg: with_broken_crc(png, b"IDAT"),
     r"has a valid header but could not be decoded \(broken PNG file \(bad header checksum in b'IDAT'\)\)"),
    (lambda png, jpeg: jpeg[:3] + b"x" * 50, r"starts like a JPEG file but its header could not be read \(no marker found\)"),
    # only a signature: the reader's words are struct's ("unpack_from requires a buffer ..."), which mean the data ended
    (lambda png, jpeg: png[:8], r"header could not be read \(the data ends inside the header, after 8 bytes\)"),
    (lambda png, jpeg: jpeg[:5], r"header could not be read \(the data ends inside the header, after 5 bytes\)"),
    (lambda png, jpeg: jpeg[:3], r"header could not be read \(its header is incomplete or malformed\)"),
])
def test_a_corrupt_file_is_refused_naming_its_index_and_the_decoders_message(coffee, damage, message):
    """Invariant: the error names the tensor, the element's index and size, and the PNG/JPEG reader's own
    reason; never Pillow's internal file object ("<_io.BytesIO object at 0x...>")."""
    png, jpeg = png_bytes(coffee), jpeg_bytes(coffee)
    broken = damage(png, jpeg)
    with pytest.raises(InvalidInputError) as info:
        images_from_bytes(np.array([png, broken, jpeg], dtype=object), **LIMITS)
    text = str(info.value)
    assert text.startswith(f"input IMAGE_BYTES element 1 ({len(broken)} bytes) ") and "BytesIO" not in text, text
    assert re.search(message, text) and text.endswith("; the file is corrupt or truncated"), text


def _with_ihdr(png: bytes, **fields: int) -> bytes:
    """``png`` with IHDR fields replaced (width, height: 4 bytes; depth, colour: 1 byte), its CRC made valid again."""
    import zlib

    body = bytearray(png[12:29])  # b"IHDR" + 13 bytes of fields
    offsets = {"width": (4, 4), "height": (8, 4), "depth": (12, 1), "colour": (13, 1)}
    for name, value in fields.items():
        start, size = offsets[name]
        body[start:start + size] = value.to_bytes(size, "big")
    return png[:12] + bytes(body) + zlib.crc32(bytes(body)).to_bytes(4, "big") + png[33:]


@pytest.mark.parametrize(("fields", "named"), [
    ({"width": 0}, "its IHDR width is 0; PNG requires 1 to 2^31-1"),
    ({"colour": 7}, "its IHDR colour type is 7; PNG allows 0, 2, 3, 4 or 6"),
    ({"depth": 3}, "its IHDR bit depth is 3; PNG allows 8, 16 for colour type 2"),
])
def test_a_png_header_that_breaks_the_specification_is_refused_naming_the_field(coffee, fields, named):
    """Invariant: a PNG whose IHDR holds a value the PNG specification forbids is refused with the field, its
    value and what PNG allows, not only "its header is incomplete or malformed"."""
    broken = _with_ihdr(png_bytes(coffee), **fields)
    with pytest.raises(InvalidInputError) as info:
        images_from_bytes(np.array([broken], dtype=object), **LIMITS)
    assert named in str(info.value), str(info.value)


def test_huge_png_is_refused_from_its_header_without_decoding():
    bomb = blank_png(12000, 12000)  # 168 KB on the wire, 144 MB decoded
    assert probe_encoded(bomb, index=0) == (12000, 12000)
    with mock.patch.object(cv2, "imdecode", wraps=cv2.imdecode) as decode:
        with pytest.raises(InvalidInputError, match=r"IMAGE_BYTES element 1 is 12000x12000 = 144000000 pixels, above the limit of 67108864"):
            images_from_bytes(np.array([blank_png(8, 8), bomb], dtype=object), **LIMITS)
    assert decode.call_count == 1  # the small first image, for its own faults; never the bomb


def test_too_many_encoded_images_are_refused_before_probing():
    with mock.patch.object(probe_module, "probe_encoded") as probe:
        with pytest.raises(InvalidInputError, match="carries 17 images; at most 16"):
            images_from_bytes(np.array([b"x"] * 17, dtype=object), **LIMITS)
    assert probe.call_count == 0


def test_a_header_pillow_refuses_to_read_gets_fastpaths_limit():
    """A 20000x20000 PNG, which Pillow refuses as a "decompression bomb DOS attack", is far above
    FastPath's max_image_pixels, and the message says its size by the header and that limit, not Pillow's wording."""
    with pytest.raises(InvalidInputError, match=r"element 0 is 400000000 pixels by its header, far above the limit "
                                                r"of 67108864 pixels \(config.pbtxt parameter max_image_pixels\)") as info:
        images_from_bytes(np.array([blank_png(20000, 20000)], dtype=object), **LIMITS)
    assert "DOS" not in str(info.value)


def test_a_truncated_jpeg_header_is_called_corrupt_not_a_non_image(coffee):
    """The first 300 bytes of a real JPEG are called a corrupt or truncated JPEG, not 'not a PNG or JPEG file'."""
    with pytest.raises(InvalidInputError, match=r"starts like a JPEG file but its header could not be read .*corrupt or truncated"):
        images_from_bytes(np.array([jpeg_bytes(coffee)[:300]], dtype=object), **LIMITS)


def test_a_png_with_a_colour_profile_decodes_silently_to_the_same_pixels():
    """A PNG carrying an iCCP chunk libpng rejects decodes without a "libpng warning" on stderr (the
    decoder runs in a subprocess so its C-level stderr is seen), and to the same pixels as without it."""
    import subprocess
    import sys

    from fastpath.models.text_detection.image import without_unused_png_chunks

    pixels = np.random.default_rng(7).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    plain, profiled = io.BytesIO(), io.BytesIO()
    Image.fromarray(pixels).save(plain, format="PNG")
    Image.fromarray(pixels).save(profiled, format="PNG", icc_profile=b"\0" * 200)  # too short for libpng
    assert b"iCCP" in profiled.getvalue() and b"iCCP" not in without_unused_png_chunks(profiled.getvalue())
    assert without_unused_png_chunks(plain.getvalue()) == plain.getvalue()  # nothing to drop: the same bytes
    code = ("import sys, numpy as np; from fastpath.models.text_detection.image import decode_encoded; "
            "out = decode_encoded(sys.stdin.buffer.read(), index=0, expected_hw=(9, 11)); sys.stdout.buffer.write(out.tobytes())")
    done = subprocess.run([sys.executable, "-c", code], input=profiled.getvalue(), capture_output=True, timeout=60)
    assert done.returncode == 0 and b"libpng" not in done.stderr, done.stderr
    assert np.array_equal(np.frombuffer(done.stdout, np.uint8).reshape(9, 11, 3), pixels)


@pytest.mark.parametrize("shape", [(1, 1, 3), (37, 53, 3), (720, 1280, 3), (37, 53, 1), (37, 53)])
def test_to_rgb8_of_bgr_and_gray_is_the_channel_swap_and_the_replication_exactly(shape):
    """The decoder's BGR becomes RGB by swapping channels (and gray by replicating it), nothing else: the
    fast OpenCV conversions give exactly what reversing and repeating the numpy channels give."""
    image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    planes = image[..., None] if image.ndim == 2 else image
    for order in ("bgr", "rgb"):
        got = to_rgb8(image, channel_order=order, where="x")
        expected = np.repeat(planes, 3, axis=2) if planes.shape[2] == 1 else planes[..., ::-1] if order == "bgr" else planes
        assert got.flags.c_contiguous and got.dtype == np.uint8
        np.testing.assert_array_equal(got, expected)


def test_an_element_over_the_pixel_limit_is_named_beside_every_other_bad_element():
    """A header over max_image_pixels is one element's fault like an unreadable one. Invariant: the 400 names every
    bad element (over the limit, not an image, empty), whatever the order; a request over max_request_pixels names
    its elements' faults after its own."""
    good, huge = blank_png(8, 8), blank_png(9000, 9000)
    with pytest.raises(InvalidInputError) as caught:
        images_from_bytes(np.array([good, b"garbage!", huge, b""], dtype=object), **LIMITS)
    message = str(caught.value)
    assert message.startswith("3 of 4 elements of input IMAGE_BYTES are bad: ")
    assert all(f"element {index}" in message for index in (1, 2, 3)) and "9000x9000 = 81000000 pixels" in message
    tight = {**LIMITS, "max_request_pixels": 100}
    with pytest.raises(InvalidInputError, match=r"carries 128 pixels in 3 images, above the limit of 100 pixels per request "
                                                r"\(max_request_pixels\); split the request; besides, input IMAGE_BYTES element 2 \(8 bytes"):
        images_from_bytes(np.array([good, good, b"garbage!"], dtype=object), **tight)
