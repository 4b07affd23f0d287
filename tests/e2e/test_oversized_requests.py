"""Oversized and malformed requests through a real tritonserver serving text_embedding and text_detection.

Each is refused with 400 / INVALID_ARGUMENT naming what was wrong (never 413, 500 or a crash), and the
server answers /v2/health/ready with 200 afterwards. Large payloads are sent once per protocol: each
costs a few hundred MB of client and server memory.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from tests.conftest import MODEL_REPOSITORY, start_server
from tests.e2e.test_text_detection import BAD_STATUS, detect_array
from tests.unit.models.text_detection.reference import assert_matches_reference, reference_boxes, skimage_rgb

pytestmark = pytest.mark.e2e
EMBEDDING, DETECTION = "text_embedding", "text_detection"
MAX_TEXT_BYTES = 1 << 20  # text_embedding's shipped max_text_bytes (docs/models.md)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    server = start_server(tmp_path_factory.mktemp("triton_oversized"), models=(EMBEDDING, DETECTION))
    try:
        yield server
    finally:
        server.stop()


def _client(server, protocol):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _refusal(server, protocol, model, name, array, datatype) -> InferenceServerException:
    """Send ``array`` as input ``name`` of ``model``; the error it gets (a success fails the test)."""
    module, client = _client(server, protocol)
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [tensor])
    finally:  # an open HTTP keep-alive connection holds up Triton's shutdown
        client.close()
    return info.value


def _assert_stays_ready(server):
    """/v2/health/ready and both models' ready endpoints answer 200."""
    for path in ("/v2/health/ready", f"/v2/models/{EMBEDDING}/ready", f"/v2/models/{DETECTION}/ready"):
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=10) as reply:
            assert reply.status == 200, path


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fp32_image_of_4096x4096_gets_400_naming_uint8(server, protocol):
    """An FP32 [1, 3, 4096, 4096] tensor (201 MB) sent as text_detection's IMAGE is refused before the model with
    400 / INVALID_ARGUMENT saying IMAGE is FP32 and the model expects UINT8 (gRPC's message-size limit, the
    other acceptable refusal, would answer RESOURCE_EXHAUSTED naming the size: Triton 2.51 gives the former);
    the server stays ready."""
    image = np.zeros((1, 3, 4096, 4096), np.float32)
    error = _refusal(server, protocol, DETECTION, "IMAGE", image, "FP32")
    del image
    assert error.status() in BAD_STATUS, error
    assert "inference input 'IMAGE' data-type is 'FP32', but model 'text_detection' expects 'UINT8'" in error.message()
    _assert_stays_ready(server)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_70_mib_text_gets_400_naming_its_bytes_and_the_per_text_limit(server, protocol):
    """One text of 70 MiB is refused with 400 / INVALID_ARGUMENT naming the element, its exact byte count and
    the per-text limit (max_text_bytes, 1 MiB); the server stays ready."""
    text = b"word " * (70 * (1 << 20) // 5)
    error = _refusal(server, protocol, EMBEDDING, "TEXT", np.array([[text]], dtype=np.object_), "BYTES")
    assert error.status() in BAD_STATUS, error
    assert f"TEXT[0] is {len(text)} bytes; the limit is {MAX_TEXT_BYTES} bytes per text" in error.message(), error.message()
    _assert_stays_ready(server)


def _binary_request(text: bytes) -> tuple[bytes, int]:
    """A KServe binary-data request body for one text of text_embedding, and the length of its JSON header."""
    header = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 4 + len(text)}}],
                         "outputs": [{"name": "EMBEDDING", "parameters": {"binary_data": False}}]}).encode()
    return header + len(text).to_bytes(4, "little") + text, len(header)


def _post(server, body: bytes, header_length: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{EMBEDDING}/infer", data=body,
                                     headers={"Inference-Header-Content-Length": header_length,
                                              "Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_binary_request_with_its_true_header_length_is_served(server):
    """The raw binary-data request the next test corrupts is well formed: with Inference-Header-Content-Length
    equal to its JSON header's length it gets 200 and the embedding the client SDK gets for the same text."""
    body, header_length = _binary_request(b"hello world")
    status, reply = _post(server, body, str(header_length))
    assert status == 200, reply[:500]
    (output,) = json.loads(reply)["outputs"]
    module, client = _client(server, "grpc")
    tensor = module.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"hello world"]], dtype=np.object_))
    expected = client.infer(EMBEDDING, [tensor]).as_numpy("EMBEDDING")
    np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]), expected, atol=1e-6)


@pytest.mark.parametrize("length", ["99999999999", "body + 1"])
def test_inference_header_length_beyond_the_body_gets_400(server, length):
    """A binary-data POST whose Inference-Header-Content-Length is 99999999999, or one byte more than the whole
    body, is refused with 400 saying the header size must lie in (0, body length) and naming the value sent;
    the server stays ready."""
    body, _ = _binary_request(b"hello world")
    value = str(len(body) + 1) if length == "body + 1" else length
    status, reply = _post(server, body, value)
    assert status == 400, reply[:500]
    assert f"inference header size should be in range (0, {len(body)}), got: {value}" in reply.decode(), reply[:500]
    _assert_stays_ready(server)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_uint8_640x640_control_image_is_served(server, protocol):
    """The well-formed counterpart of the FP32 image: a uint8 [1, 640, 640, 3] photo (page.png scaled and cropped)
    gets 200 and rapidocr's boxes for it (IoU >= 0.9, equal counts); the server stays ready."""
    image = np.ascontiguousarray(np.tile(skimage_rgb("page.png", 2.0), (2, 1, 1))[:640, :640])
    boxes, _, counts = detect_array(server, protocol, image[None])
    assert counts.tolist() == [len(boxes)] and len(boxes) > 0
    assert_matches_reference(boxes, reference_boxes(image))
    _assert_stays_ready(server)
