"""text_detection through FastPath's scheduler under a real tritonserver.

Concurrent requests of real photos (scikit-image's wheel), several of one resized shape and several
of others, are batched across requests by resized shape and staged in the host staging pool; each
served result must equal the same image sent alone, byte for byte. A bad request sent among them
fails alone with a 400 naming the tensor. Metrics show cross-request batches (more images than
engine calls) and every staging lease returned. Unload answers every request in flight once.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from tests.conftest import MODEL_REPOSITORY, start_server, variant_repository
from tests.e2e.test_scheduler import _metric_sum, _metrics
from tests.e2e.test_text_detection import BAD_STATUS, MODEL, _split, detect_array, detect_bytes
from tests.unit.models.text_detection.reference import png_bytes, skimage_path, skimage_rgb

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    server = start_server(tmp_path_factory.mktemp("triton_detection_scheduler"), models=(MODEL,))
    try:
        yield server
    finally:
        server.stop()


def _photos() -> dict[str, np.ndarray]:
    """uint8 RGB photos and their resized shapes: three share 192x384, three 512x512; the others differ."""
    page = skimage_rgb("page.png")  # 191x384 -> 192x384
    return {
        "page": page,
        "page_flipped": np.ascontiguousarray(page[::-1, ::-1]),  # 192x384
        "page_x2": skimage_rgb("page.png", 2.0),  # 382x768 -> 384x768
        "text_x2": skimage_rgb("text.png", 2.0),  # 344x896 -> 352x896
        "coffee": skimage_rgb("coffee.png"),  # 400x600 -> 384x608
        "astronaut": skimage_rgb("astronaut.png"),  # 512x512
        "camera": skimage_rgb("camera.png"),  # 512x512
        "white": np.full((512, 512, 3), 255, np.uint8),  # 512x512, no text
    }


def _send(server, job):
    """job: (kind, payload, protocol) -> ("ok", (boxes, scores, counts)) or ("error", exception)."""
    kind, payload, protocol = job
    try:
        if kind == "array":
            return "ok", detect_array(server, protocol, payload[None])
        return "ok", detect_bytes(server, protocol, payload)
    except InferenceServerException as exc:
        return "error", exc


def test_concurrent_requests_are_batched_by_shape_and_equal_each_image_alone(server):
    photos = _photos()
    alone = {name: detect_array(server, "grpc", image[None]) for name, image in photos.items()}
    before = _metrics(server)
    jobs = [("array", photos[name], "grpc" if i % 2 else "http") for i, name in enumerate(photos)]
    jobs.insert(4, ("bytes", [png_bytes(photos["page"]), b"GIF89a not a png"], "http"))  # bad: fails alone
    multi = ["coffee", "page", "astronaut", "page_x2"]  # one request, four images of four shapes
    jobs.insert(2, ("bytes", [png_bytes(photos[name]) for name in multi], "grpc"))
    jobs += [("array", photos[name], "grpc") for name in ("page", "astronaut", "camera", "white")]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: _send(server, job), jobs))

    bad = [outcome for (kind, payload, _), outcome in zip(jobs, results) if kind == "bytes" and len(payload) == 2]
    ((status, error),) = bad
    assert status == "error" and error.status() in BAD_STATUS
    assert "IMAGE_BYTES element 1" in error.message() and "is not a PNG or JPEG file" in error.message()
    for (kind, payload, _), (status, result) in zip(jobs, results):
        if kind == "bytes":
            if len(payload) == 2:
                continue
            assert status == "ok", result
            for name, (boxes, scores) in zip(multi, _split(*result)):
                np.testing.assert_array_equal(boxes, alone[name][0], err_msg=name)
                np.testing.assert_array_equal(scores, alone[name][1], err_msg=name)
            continue
        assert status == "ok", result
        (name,) = [n for n, image in photos.items() if image is payload]
        for served, expected in zip(result, alone[name]):
            np.testing.assert_array_equal(served, expected, err_msg=name)
    assert alone["page"][2].tolist() == [5] and alone["white"][2].tolist() == [0]

    after, labels = _metrics(server), {"model": MODEL, "version": "1"}
    calls = _metric_sum(after, "fastpath_batch_size_count", **labels) - _metric_sum(before, "fastpath_batch_size_count", **labels)
    images = _metric_sum(after, "fastpath_batch_size_sum", **labels) - _metric_sum(before, "fastpath_batch_size_sum", **labels)
    assert images == len(photos) + len(multi) + 4  # the bad request never reached the queue
    assert calls < images, f"{images} images in {calls} engine calls: no request was batched with another"


def test_staging_pool_metrics_are_published_and_every_lease_returned(server):
    detect_bytes(server, "http", [skimage_path("page.png").read_bytes()])
    text, labels = _metrics(server), {"model": MODEL, "pool": "staging"}
    assert _metric_sum(text, "fastpath_pool_leases_total", **labels) >= 1
    assert _metric_sum(text, "fastpath_pool_outstanding_leases", **labels) == 0
    assert _metric_sum(text, "fastpath_pool_capacity_bytes", **labels) == 512 << 20
    assert re.search(r'fastpath_pool_pinned\{[^}]*allocator="(page-aligned|cuda-pinned)"[^}]*pool="staging"', text)


def test_unload_answers_every_request_in_flight_once(server):
    """Clients keep sending while the model unloads: each request gets exactly one answer (its boxes, or
    not-found / unavailable once the model is gone); none hangs. Then the model loads again."""
    page = skimage_rgb("page.png")[None]
    expected = detect_array(server, "grpc", page)[0]
    outcomes: list[str] = []
    done = threading.Condition()

    def client_loop():
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("IMAGE", list(page.shape), "UINT8")
        tensor.set_data_from_numpy(page)
        while True:
            try:
                boxes = client.infer(MODEL, [tensor], client_timeout=120).as_numpy("BOXES")
                outcome = "ok" if np.array_equal(boxes, expected) else "wrong boxes"
            except InferenceServerException as exc:
                outcome = exc.message()
            with done:
                outcomes.append(outcome)
                done.notify_all()
            if outcome != "ok":
                return

    threads = [threading.Thread(target=client_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    with done:
        assert done.wait_for(lambda: outcomes.count("ok") >= 6, timeout=120)
    admin = httpclient.InferenceServerClient(server.http_url)
    admin.unload_model(MODEL)
    for thread in threads:
        thread.join(150)
    assert not any(thread.is_alive() for thread in threads), "a request never got its answer"
    unexpected = [o for o in outcomes if o != "ok" and not re.search(r"unknown model|not found|unavailable|shutting down|unload", o, re.I)]
    assert not unexpected, unexpected
    admin.load_model(MODEL)
    assert server.is_ready(models=[MODEL])
    np.testing.assert_array_equal(detect_array(server, "http", page)[0], expected)
    assert "Stub process" not in server.log_path.read_text()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_only_the_requested_outputs_come_back(server, protocol):
    """A client asking for BOX_COUNTS alone gets only it, equal to the full answer's (see
    fastpath.triton.requests.select_outputs for why FastPath never sends unrequested outputs)."""
    module = grpcclient if protocol == "grpc" else httpclient
    client = (grpcclient.InferenceServerClient(server.grpc_url) if protocol == "grpc"
              else httpclient.InferenceServerClient(server.http_url))
    image = skimage_rgb("page.png")[None]
    tensor = module.InferInput("IMAGE", list(image.shape), "UINT8")
    tensor.set_data_from_numpy(np.ascontiguousarray(image))
    full = client.infer(MODEL, [tensor])
    only = client.infer(MODEL, [tensor], outputs=[module.InferRequestedOutput("BOX_COUNTS")])
    assert only.as_numpy("BOXES") is None and only.as_numpy("SCORES") is None
    np.testing.assert_array_equal(only.as_numpy("BOX_COUNTS"), full.as_numpy("BOX_COUNTS"))
    assert int(full.as_numpy("BOX_COUNTS").sum()) > 0


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    """text_detection with a 16-image queue (the least its 16 images per request allow)."""
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    root = tmp_path_factory.mktemp("detection_small_queue")
    server = start_server(root, models=(MODEL,), repository=variant_repository(root, MODEL, max_queue_images="16"))
    try:
        yield server
    finally:
        server.stop()


def _png_header(height: int, width: int) -> bytes:
    """The first bytes of a PNG of ``height`` x ``width`` 8-bit gray pixels: its signature, a valid IHDR chunk and
    an empty IDAT chunk (where a reader of the header stops)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) + chunk(b"IDAT", b"")


def test_a_full_queue_rejects_before_decoding_with_retryable_unavailable(small_queue_server):
    """execute() checks for room in the queue before it decodes a call's images, so a 503 comes at once,
    not 5-20 s late. A burst of 8 requests x 16 images into a 16-image queue: the overflow is
    answered UNAVAILABLE naming images, the accepted requests get their boxes, the server stays ready.
    Requests wrong in themselves, of 16 images sent once the queue has overflowed (no room for them while any
    image is queued), are still 400s naming what is wrong, never a retryable 503 a client would send again
    unchanged: a negative priority, an IMAGE of 7 channels (its shape), and IMAGE_BYTES with an empty element,
    bytes that are no image, or a PNG whose header says 9000x9000 (its headers)."""
    page = skimage_rgb("page.png")
    batch = np.repeat(np.stack([page, page, page], axis=-1)[np.newaxis] if page.ndim == 2 else page[np.newaxis], 16, axis=0)
    overflowed = threading.Event()

    def send(_):
        try:
            return detect_array(small_queue_server, "grpc", batch), None
        except InferenceServerException as exc:
            if exc.status() == "StatusCode.UNAVAILABLE":
                overflowed.set()
            return None, exc

    huge_png = _png_header(9000, 9000)
    bad_requests = {  # 16 images each: no room for them while any image is queued
        "fastpath_priority = -1 is a negative integer": ("IMAGE", batch, {"fastpath_priority": -1}),
        "expected [N, H, W, C] with C = 1 (gray)": ("IMAGE", np.zeros((16, 8, 8, 7), np.uint8), {}),
        "input IMAGE_BYTES element 3 is empty (0 bytes)": ("IMAGE_BYTES", [huge_png[:0] if i == 3 else png_bytes(page) for i in range(16)], {}),
        "is not a PNG or JPEG file": ("IMAGE_BYTES", [b"hello"] * 16, {}),
        "element 0 is 9000x9000 = 81000000 pixels, above the limit": ("IMAGE_BYTES", [huge_png] * 16, {}),
    }

    def send_bad(kind):
        assert overflowed.wait(120), "the burst never filled the queue"
        name, data, parameters = bad_requests[kind]
        array = np.array(data, dtype=np.object_) if name == "IMAGE_BYTES" else data
        client = grpcclient.InferenceServerClient(small_queue_server.grpc_url)
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if name == "IMAGE_BYTES" else "UINT8")
        tensor.set_data_from_numpy(array)
        try:
            client.infer(MODEL, [tensor], parameters=parameters)
        except InferenceServerException as exc:
            return exc
        finally:
            client.close()
        return None

    with concurrent.futures.ThreadPoolExecutor(13) as pool:
        bad = {kind: pool.submit(send_bad, kind) for kind in bad_requests}
        results = list(pool.map(send, range(8)))
        bad_errors = {kind: future.result() for kind, future in bad.items()}
    errors = [error for _, error in results if error is not None]
    assert errors, "8 x 16 images into a 16-image queue must overflow it"
    assert {error.status() for error in errors} == {"StatusCode.UNAVAILABLE"}
    assert all("Exceeds maximum queue size" in e.message() and "images queued" in e.message() for e in errors)
    good = [outputs for outputs, error in results if error is None]
    assert good and all(counts.shape == (16,) and counts.min() > 0 for _, _, counts in good)
    for kind, error in bad_errors.items():
        assert error is not None and error.status() == "StatusCode.INVALID_ARGUMENT", (kind, error)
        assert kind in error.message(), (kind, error.message())
    assert small_queue_server.is_ready(models=[MODEL])
