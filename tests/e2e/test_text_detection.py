"""text_detection through a real tritonserver, over HTTP and gRPC, against rapidocr in-process.

Served boxes are matched one-to-one with the boxes rapidocr-onnxruntime's own TextDetector finds on
the same image (shipped resize policy, min/736) at IoU >= 0.9 (tests/unit/models/text_detection/reference.py MIN_IOU); the counts
must be equal. Bad and odd input (empty, textless, oversized, off-grid sizes) fails alone or gets typed
empty outputs.
"""

from __future__ import annotations

import concurrent.futures
import io

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from fastpath_client._core import collect
from tests.conftest import MODEL_REPOSITORY, start_server
from tests.unit.models.text_detection.reference import (
    assert_matches_reference,
    blank_png,
    jpeg_bytes,
    labelled_boxes,
    png_bytes,
    recall,
    reference_boxes,
    skimage_path,
    skimage_rgb,
    with_broken_crc,
)

pytestmark = pytest.mark.e2e
MODEL = "text_detection"
OUTPUTS = ("BOXES", "SCORES", "BOX_COUNTS")
BAD_STATUS = ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)  # what `fastpath build --if-missing` does
    server = start_server(tmp_path_factory.mktemp("triton_detection"), models=(MODEL,))
    try:
        yield server
    finally:
        server.stop()


def _infer(server, protocol, inputs, request_id=""):
    """inputs: list of (name, array, datatype) -> (boxes [K,4,2], scores [K], counts [N])."""
    module = httpclient if protocol == "http" else grpcclient
    client = (httpclient.InferenceServerClient(server.http_url, network_timeout=120) if protocol == "http"
              else grpcclient.InferenceServerClient(server.grpc_url))
    tensors = []
    for name, array, datatype in inputs:
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    try:  # closed after each call: an open HTTP keep-alive connection holds up Triton's shutdown for 30 s
        result = client.infer(MODEL, tensors, outputs=[module.InferRequestedOutput(n) for n in OUTPUTS], request_id=request_id)
        arrays = collect(result, MODEL, OUTPUTS)  # the SDK's reading: empty outputs in the response's datatype
        return tuple(arrays[n] for n in OUTPUTS)
    finally:
        client.close()


def detect_array(server, protocol, batch):
    return _infer(server, protocol, [("IMAGE", np.ascontiguousarray(batch), "UINT8")])


def detect_bytes(server, protocol, files):
    return _infer(server, protocol, [("IMAGE_BYTES", np.array(files, dtype=np.object_), "BYTES")])


def _split(boxes, scores, counts):
    edges = np.concatenate([[0], np.cumsum(counts)])
    return [(boxes[a:b], scores[a:b]) for a, b in zip(edges[:-1], edges[1:])]


def _assert_typed(boxes, scores, counts, images):
    assert boxes.dtype == np.float32 and boxes.ndim == 3 and boxes.shape[1:] == (4, 2)
    assert scores.dtype == np.float32 and scores.shape == (boxes.shape[0],)
    assert counts.dtype == np.int32 and counts.shape == (images,) and counts.sum() == boxes.shape[0]


def _decoded_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


REAL = [  # (name, scale, how it is sent, protocol)
    ("page.png", 1.0, "file", "http"),
    ("page.png", 3.0, "array", "grpc"),
    ("text.png", 2.0, "array", "http"),
    ("rocket.jpg", 1.0, "file", "grpc"),
    ("coffee.png", 1.0, "array", "grpc"),
    ("astronaut.png", 1.0, "png", "http"),
]


@pytest.mark.parametrize(("name", "scale", "form", "protocol"), REAL)
def test_real_photos_match_rapidocr(server, name, scale, form, protocol):
    if form == "file":
        data = skimage_path(name).read_bytes()
        image, result = _decoded_rgb(data), detect_bytes(server, protocol, [data])
    else:
        image = skimage_rgb(name, scale)
        result = detect_array(server, protocol, image[None]) if form == "array" else detect_bytes(server, protocol, [png_bytes(image)])
    boxes, scores, counts = result
    _assert_typed(boxes, scores, counts, 1)
    assert_matches_reference(boxes, reference_boxes(image))
    assert (scores >= 0.5).all() and (scores <= 1.0).all()
    height, width = image.shape[:2]
    assert (boxes[..., 0] >= 0).all() and (boxes[..., 0] <= width - 1).all()
    assert (boxes[..., 1] >= 0).all() and (boxes[..., 1] <= height - 1).all()


def test_several_files_in_one_request_equal_single_requests(server):
    page = skimage_path("page.png").read_bytes()
    files = [page, png_bytes(np.full((640, 640, 3), 255, np.uint8)), png_bytes(skimage_rgb("text.png", 2.0)),
             skimage_path("rocket.jpg").read_bytes(), page]
    boxes, scores, counts = detect_bytes(server, "grpc", files)
    _assert_typed(boxes, scores, counts, len(files))
    assert counts.tolist() == [5, 0, 7, 0, 5]  # min/736: text.png x2 has 7 boxes (max/960: 1), rocket.jpg 0 (max/960: 1)
    for data, (part_boxes, part_scores) in zip(files, _split(boxes, scores, counts)):
        alone_boxes, alone_scores, _ = detect_bytes(server, "http", [data])
        np.testing.assert_array_equal(part_boxes, alone_boxes)
        np.testing.assert_array_equal(part_scores, alone_scores)


def test_same_size_array_batch_equals_single_requests(server):
    page = skimage_rgb("page.png")
    batch = np.stack([page, np.full_like(page, 255), page[::-1, ::-1]])
    boxes, scores, counts = detect_array(server, "http", batch)
    assert counts.tolist()[:2] == [5, 0]
    for image, (part_boxes, part_scores) in zip(batch, _split(boxes, scores, counts)):
        alone_boxes, alone_scores, _ = detect_array(server, "grpc", image[None])
        np.testing.assert_array_equal(part_boxes, alone_boxes)
        np.testing.assert_array_equal(part_scores, alone_scores)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_no_text_gives_200_with_typed_empty_outputs(server, protocol):
    """An image without text: white 640x640x3 and black 32x32 -> BOXES [0,4,2], SCORES [0]; beside a photo, its boxes intact."""
    for image in (np.full((640, 640, 3), 255, np.uint8), np.zeros((32, 32, 3), np.uint8)):
        boxes, scores, counts = detect_array(server, protocol, image[None])
        assert boxes.shape == (0, 4, 2) and scores.shape == (0,) and counts.tolist() == [0]
        _assert_typed(boxes, scores, counts, 1)
    page = skimage_path("page.png").read_bytes()
    boxes, scores, counts = detect_bytes(server, protocol, [png_bytes(np.full((640, 640, 3), 255, np.uint8)), page])
    assert counts.tolist() == [0, 5]
    np.testing.assert_array_equal(boxes, detect_bytes(server, protocol, [page])[0])


OFF_GRID_SIZES = [(1, 1), (31, 31), (33, 50), (641, 479), (100, 3000)]


def _crop(height, width):
    """A region of the given size of page.png scaled 3x (573x1152), tiled when needed."""
    photo = skimage_rgb("page.png", 3.0)
    tiled = np.tile(photo, (1 + height // photo.shape[0], 1 + width // photo.shape[1], 1))
    return np.ascontiguousarray(tiled[:height, :width])


@pytest.mark.parametrize(("height", "width"), OFF_GRID_SIZES)
def test_sizes_off_the_32_pixel_grid_match_rapidocr_within_the_image(server, height, width):
    """Images whose sides are not multiples of 32 (1x1 .. 100x3000) give rapidocr's boxes, all inside the image;
    100x3000, whose min/736 resize (736x22080) FastPath clamps to max_resized_pixels (256x7904), is not compared."""
    image = _crop(height, width)
    boxes, scores, counts = detect_array(server, "grpc", image[None])
    _assert_typed(boxes, scores, counts, 1)
    if (height, width) != (100, 3000):
        assert_matches_reference(boxes, reference_boxes(image))
    assert (boxes[..., 0] <= width - 1).all() and (boxes[..., 1] <= height - 1).all() and (boxes >= 0).all()


def test_sizes_off_the_32_pixel_grid_mixed_in_one_request_equal_each_alone(server):
    """Those sizes in one request give each image the boxes it gets alone."""
    files = [png_bytes(_crop(h, w)) for h, w in OFF_GRID_SIZES]
    boxes, scores, counts = detect_bytes(server, "http", files)
    assert counts.tolist()[3] == 8  # the 641x479 page region under min/736 (7 under max/960)
    for data, (part_boxes, _) in zip(files, _split(boxes, scores, counts)):
        np.testing.assert_array_equal(part_boxes, detect_bytes(server, "http", [data])[0])


def test_8000x8000_page_is_accepted(server):
    """8000x8000 (64 MP, under the 8192*8192 cap) -> clamped to 1440x1440 (max_resized_pixels); a blank page has no text."""
    boxes, scores, counts = detect_bytes(server, "grpc", [blank_png(8000, 8000)])
    assert boxes.shape == (0, 4, 2) and counts.tolist() == [0]


def test_8000x8000_page_mixed_with_small_images_equals_each_alone(server):
    """An 8000x8000 page of text (page.png scaled 3x and tiled, gray PNG) between a 33x50 and a 641x479 image in one
    request (64.3 Mpx, under max_request_pixels) gets 200, and each image's BOXES and SCORES rows equal,
    exactly, what that image gets sent alone; the page has boxes."""
    files = [png_bytes(_crop(33, 50)), png_bytes(_crop(8000, 8000)[..., 0]), png_bytes(_crop(641, 479))]
    boxes, scores, counts = detect_bytes(server, "grpc", files)
    _assert_typed(boxes, scores, counts, len(files))
    assert counts[1] > 0
    for data, (part_boxes, part_scores) in zip(files, _split(boxes, scores, counts)):
        alone_boxes, alone_scores, _ = detect_bytes(server, "grpc", [data])
        np.testing.assert_array_equal(part_boxes, alone_boxes)
        np.testing.assert_array_equal(part_scores, alone_scores)


def test_grayscale_rgba_and_16_bit_equal_rgb(server):
    page = skimage_rgb("page.png")
    expected, _, _ = detect_array(server, "http", page[None])
    gray = page[..., :1]
    rgba = np.concatenate([page, np.full_like(gray, 255)], axis=2)
    variants = {
        "gray array [1,H,W,1]": detect_array(server, "http", gray[None]),
        "RGBA array": detect_array(server, "grpc", rgba[None]),
        "gray PNG": detect_bytes(server, "http", [png_bytes(gray[..., 0])]),
        "RGBA PNG": detect_bytes(server, "grpc", [png_bytes(rgba)]),
        "16-bit gray PNG": detect_bytes(server, "http", [png_bytes(gray[..., 0].astype(np.uint16) * 257)]),
        "16-bit RGB PNG": detect_bytes(server, "grpc", [png_bytes(page.astype(np.uint16) * 257)]),
    }
    for name, (boxes, _, _) in variants.items():
        np.testing.assert_array_equal(boxes, expected, err_msg=name)


def test_jpeg_encoded_photo_matches_rapidocr(server):
    data = jpeg_bytes(skimage_rgb("page.png", 3.0), quality=90)
    boxes, _, _ = detect_bytes(server, "http", [data])
    assert_matches_reference(boxes, reference_boxes(_decoded_rgb(data)))


BAD = {  # name -> (inputs, substrings of the error message)
    "not an image": ([("IMAGE_BYTES", np.array([b"hello world"], dtype=np.object_), "BYTES")], "is not a PNG or JPEG file"),
    "empty file": ([("IMAGE_BYTES", np.array([b""], dtype=np.object_), "BYTES")], "element 0 is empty (0 bytes)"),
    "gif": ([("IMAGE_BYTES", np.array([skimage_path("no_time_for_that_tiny.gif").read_bytes()], dtype=np.object_), "BYTES")],
            "is not a PNG or JPEG file"),
    "truncated png": ([("IMAGE_BYTES", np.array([png_bytes(skimage_rgb("coffee.png"))[:3000]], dtype=np.object_), "BYTES")],
                      "element 0 (3000 bytes) has a valid header but could not be decoded (Truncated File Read); the file is corrupt or truncated"),
    "png header cut short, second of two": (
        [("IMAGE_BYTES", np.array([blank_png(8, 8), png_bytes(skimage_rgb("coffee.png"))[:40]], dtype=np.object_), "BYTES")],
        "element 1 (40 bytes) starts like a PNG file but its header could not be read (broken PNG file (chunk b'IDA'))"),
    "png with a broken IHDR checksum": (
        [("IMAGE_BYTES", np.array([with_broken_crc(blank_png(8, 8), b"IHDR")], dtype=np.object_), "BYTES")],
        "element 0 (", "header could not be read (broken PNG file (bad header checksum in b'IHDR'))"),
    "png with a broken IDAT checksum, third of three": (
        [("IMAGE_BYTES", np.array([blank_png(8, 8), blank_png(9, 9), with_broken_crc(blank_png(8, 8), b"IDAT")], dtype=np.object_), "BYTES")],
        "element 2 (", "has a valid header but could not be decoded (broken PNG file (bad header checksum in b'IDAT'))"),
    "zero-sized image [1,0,0,3]": ([("IMAGE", np.zeros((1, 0, 0, 3), np.uint8), "UINT8")], "zero-sized dimension"),
    "zero files [0]": ([("IMAGE_BYTES", np.zeros((0,), dtype=np.object_), "BYTES")], "zero-sized dimension"),
    "five channels": ([("IMAGE", np.zeros((1, 8, 8, 5), np.uint8), "UINT8")], "C = 1 (gray), 2 (gray+alpha), 3 (RGB) or 4 (RGBA)"),
    "both inputs": ([("IMAGE", np.zeros((1, 8, 8, 3), np.uint8), "UINT8"),
                     ("IMAGE_BYTES", np.array([blank_png(8, 8)], dtype=np.object_), "BYTES")], "send exactly one of the inputs"),
    "no input": ([], "send exactly one of the inputs"),
    "2-D image (no N, no C)": ([("IMAGE", np.zeros((8, 8), np.uint8), "UINT8")], "Expected [-1,-1,-1,-1], got [8,8]"),
    "16-bit raw tensor": ([("IMAGE", np.zeros((1, 8, 8, 3), np.uint16), "UINT16")], "expects 'UINT8'"),
    "huge png 12000x12000": ([("IMAGE_BYTES", np.array([blank_png(12000, 12000)], dtype=np.object_), "BYTES")],
                             "12000x12000 = 144000000 pixels, above the limit of 67108864 pixels"),
    "17 images": ([("IMAGE", np.zeros((17, 8, 8, 3), np.uint8), "UINT8")], "carries 17 images; at most 16"),
    # more images than the whole queue holds (max_queue_images 64) on an idle server: still the per-request 400,
    # never the retryable 503 of a full queue (a client would retry it forever)
    "65 images": ([("IMAGE", np.zeros((65, 8, 8, 3), np.uint8), "UINT8")], "input IMAGE carries 65 images; at most 16"),
    "65 files": ([("IMAGE_BYTES", np.array([blank_png(8, 8)] * 65, dtype=np.object_), "BYTES")],
                 "input IMAGE_BYTES carries 65 images; at most 16"),
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_400_naming_the_problem(server, case, protocol):
    inputs, *expected = BAD[case]
    with pytest.raises(InferenceServerException) as info:
        _infer(server, protocol, inputs)
    assert info.value.status() in BAD_STATUS, info.value
    assert all(part in info.value.message() for part in expected), info.value.message()
    assert "BytesIO" not in info.value.message()  # no Python object of the server's in a client's error


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", ["17 images", "png with a broken IDAT checksum, third of three"])
def test_an_error_starts_with_the_request_id_as_tritons_own_do(server, case, protocol):
    """A refusal found before queueing (the image count) and one found on a decode thread both name the
    client's request id first, in Triton's own form, so a client can match the error to its request."""
    inputs, *expected = BAD[case]
    with pytest.raises(InferenceServerException) as info:
        _infer(server, protocol, inputs, request_id="req-42")
    assert info.value.message().startswith("[request id: req-42] "), info.value.message()
    assert all(part in info.value.message() for part in expected)


def test_bad_requests_among_good_ones_fail_alone_and_server_stays_ready(server):
    """Zero-sized and oversized requests concurrent with normal ones fail alone; the normal ones and a
    later request succeed and the server stays ready."""
    page = skimage_rgb("page.png")[None]
    expected = detect_array(server, "http", page)[0]
    jobs = [("good", i) if i % 3 else (("zero", "huge")[i % 2], i) for i in range(12)]

    def send(job):
        kind, index = job
        protocol = "http" if index % 2 else "grpc"
        try:
            if kind == "good":
                return kind, detect_array(server, protocol, page)[0]
            if kind == "zero":
                return kind, detect_array(server, protocol, np.zeros((1, 0, 0, 3), np.uint8))
            return kind, detect_bytes(server, protocol, [blank_png(12000, 12000)])
        except InferenceServerException as exc:
            return kind, exc

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, jobs))
    for kind, outcome in results:
        if kind == "good":
            np.testing.assert_array_equal(outcome, expected)
        else:
            assert isinstance(outcome, InferenceServerException) and outcome.status() in BAD_STATUS
    assert server.is_ready()
    np.testing.assert_array_equal(detect_array(server, "grpc", page)[0], expected)
    assert "Stub process" not in server.log_path.read_text()


def test_shipped_min_736_policy_finds_the_benchmarked_boxes_on_text_png(server):
    """The shipped default (min/736) finds the 6 boxes on text.png that docs/benchmarks/text_detection_resize.md
    records (max/960 finds 0), 2 of the 15 hand-labelled ones at IoU >= 0.5, and 5 on page.png, 5 of 7 labelled."""
    labels = labelled_boxes()
    text, _, _ = detect_array(server, "http", skimage_rgb("text.png")[None])
    page, _, _ = detect_array(server, "http", skimage_rgb("page.png")[None])
    assert (len(text), len(page)) == (6, 5)
    assert recall(text, labels["text.png"]) >= 2 / 15 and recall(page, labels["page.png"]) >= 5 / 7
