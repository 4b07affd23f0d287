"""text_embedding through a real tritonserver, over HTTP and gRPC, against sentence-transformers."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e
MODEL = "text_embedding"
EDGE_TEXTS = ["", "   ", "\t\n", " 😃 hello how are you", "🥱", "的人有", "naïve café", "\x00abc", "\ufffd", "word " * 20000]


def _client(server, protocol):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url, concurrency=4, network_timeout=120)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _embed(server, protocol, texts, request_id=""):
    module, client = _client(server, protocol)
    data = np.array([[t.encode("utf-8") if isinstance(t, str) else t] for t in texts], dtype=np.object_)
    tensor = module.InferInput("TEXT", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    outputs = [module.InferRequestedOutput(n) for n in ("EMBEDDING", "TOKEN_COUNT", "TRUNCATED")]
    result = client.infer(MODEL, [tensor], outputs=outputs, request_id=request_id)
    return result.as_numpy("EMBEDDING"), result.as_numpy("TOKEN_COUNT"), result.as_numpy("TRUNCATED")


def _cosine(a, b):
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_real_sentences_match_sentence_transformers(triton_server, reference, sentences, protocol):
    texts = sentences[:: max(1, len(sentences) // 96)][:96]
    got = np.concatenate([_embed(triton_server, protocol, texts[i : i + 32])[0] for i in range(0, len(texts), 32)])
    assert got.shape == (len(texts), 384) and got.dtype == np.float32
    assert _cosine(got, reference(texts)).min() >= 0.9999


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_edge_texts_match_reference_with_counts(triton_server, reference, protocol):
    """Empty, blank, unicode, NUL and a 100 KB text each give sentence-transformers' vector, with their
    token counts; only the 100 KB text is truncated."""
    embedding, token_count, truncated = _embed(triton_server, protocol, EDGE_TEXTS)
    assert np.isfinite(embedding).all()
    assert _cosine(embedding, reference(EDGE_TEXTS)).min() >= 0.9999
    assert token_count.reshape(-1).tolist() == [2, 2, 2, 7, 3, 5, 4, 3, 2, 256]
    assert truncated.reshape(-1).tolist() == [False] * 9 + [True]


def test_empty_text_keeps_row_order(triton_server, reference):
    """An empty text keeps its place: ["first sentence", "second one", ""] -> three rows, in order."""
    texts = ["first sentence", "second one", ""]
    embedding, _, _ = _embed(triton_server, "grpc", texts)
    assert _cosine(embedding, reference(texts)).min() >= 0.9999


BLANK_TEXTS = ["", "   ", "\t\n"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("text", BLANK_TEXTS, ids=["empty", "spaces", "tab-newline"])
def test_blank_text_alone_is_one_unit_row_of_two_tokens_matching_reference(triton_server, reference, text, protocol):
    """A blank text as a request of its own (shape [1, 1]) gets one row: EMBEDDING [1, 384] of unit L2 norm,
    TOKEN_COUNT 2 ([CLS] [SEP]), TRUNCATED false, and cosine >= 0.9999 with sentence-transformers' vector
    for the same text."""
    embedding, token_count, truncated = _embed(triton_server, protocol, [text])
    assert embedding.shape == (1, 384) and np.isfinite(embedding).all()
    assert abs(float(np.linalg.norm(embedding[0])) - 1.0) <= 1e-5
    assert token_count.reshape(-1).tolist() == [2] and truncated.reshape(-1).tolist() == [False]
    assert float(_cosine(embedding, reference([text]))[0]) >= 0.9999


def test_concurrent_single_text_requests_ending_in_empty_equal_each_alone(triton_server):
    """Three one-text requests sent at once, the last of them "" (the scheduler may batch them together),
    over several rounds and both protocols: each response's EMBEDDING row equals, within 1e-5, and its
    TOKEN_COUNT equals exactly what the same text gets sent alone."""
    texts = ["A quick brown fox jumps over the lazy dog.", "Triton serves models.", ""]
    alone = {text: _embed(triton_server, "http", [text]) for text in texts}

    def send_together(text, protocol, start):
        start.wait(timeout=30)  # the three leave together
        return _embed(triton_server, protocol, [text])

    for round_index in range(16):
        protocol, start = ("http", "grpc")[round_index % 2], threading.Barrier(len(texts))
        with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
            answers = list(pool.map(lambda text, p=protocol, b=start: send_together(text, p, b), texts))
        for text, (embedding, token_count, _) in zip(texts, answers):
            np.testing.assert_allclose(embedding, alone[text][0], atol=1e-5, err_msg=f"round {round_index}: {text!r}")
            assert token_count.tolist() == alone[text][1].tolist(), (round_index, text)


def test_hello_world_independent_of_neighbours(triton_server):
    """A text's embedding does not depend on its neighbours: the same row alone, beside a ~360-token
    text, and among concurrent requests."""
    alone = _embed(triton_server, "http", ["hello world"])[0][0]
    long_text = " ".join(["inference"] * 360)
    beside = _embed(triton_server, "http", ["hello world", long_text])[0][0]
    np.testing.assert_allclose(beside, alone, atol=1e-5)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(lambda t: _embed(triton_server, "grpc", [t])[0][0], ["hello world", long_text] * 4))
    for row in rows[::2]:
        np.testing.assert_allclose(row, alone, atol=1e-5)


def _post(server, body: bytes, headers=None):
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{MODEL}/infer", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


BAD_JSON = {
    "wrong dtype": ({"name": "TEXT", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}, "expects 'BYTES'"),
    "no batch dim": ({"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["x"]}, "Expected [-1,1], got [1]"),
    "zero batch": ({"name": "TEXT", "shape": [0, 1], "datatype": "BYTES", "data": []}, "TEXT"),
    "zero dim": ({"name": "TEXT", "shape": [1, 0], "datatype": "BYTES", "data": []}, "got [1,0]"),
    "two per row": ({"name": "TEXT", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}, "Expected [-1,1], got [1,2]"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_requests_get_400_naming_tensor(triton_server, case):
    tensor, expected = BAD_JSON[case]
    status, body = _post(triton_server, json.dumps({"inputs": [tensor]}).encode())
    assert status == 400, body
    assert "TEXT" in body.decode() and expected in body.decode()


def test_missing_input_gets_400(triton_server):
    status, body = _post(triton_server, b'{"inputs": []}')
    assert status == 400 and "missing required input(s) ['TEXT']" in body.decode()


def test_a_json_body_above_4_mb_sent_as_application_json_is_answered(triton_server):
    """Triton 2.51 crashes on a JSON body above ~4 MB only when it comes as
    application/x-www-form-urlencoded (curl -d's and urllib's default):
    labelled application/json, the README's workaround, 5.6 MB is answered."""
    texts = [("word " * 140_000)[: 700_000 - k] for k in range(8)]
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [8, 1], "datatype": "BYTES", "data": texts}],
                       "outputs": [{"name": "TRUNCATED"}]}).encode()
    assert len(body) > 5_000_000
    status, reply = _post(triton_server, body, {"Content-Type": "application/json"})
    assert status == 200, reply[:500]
    truncated = json.loads(reply)["outputs"][0]
    assert truncated["shape"] == [8, 1] and truncated["data"] == [True] * 8


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_invalid_utf8_gets_400_and_others_unaffected(triton_server, protocol):
    """Invalid UTF-8 (raw bytes b"\\xff\\xfe\\xfd") is refused with a 400 naming the element and byte; a
    later request with a NUL is unaffected."""
    with pytest.raises(InferenceServerException) as info:
        _embed(triton_server, protocol, [b"fine", b"\xff\xfe\xfd"])
    message = info.value.message()
    assert "TEXT[1] is not valid UTF-8: byte 0xff" in message
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert _embed(triton_server, protocol, [b"abc\x00"])[1].reshape(-1).tolist() == [3]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_error_starts_with_the_request_id_as_tritons_own_do(triton_server, protocol):
    """FastPath's refusal names the client's request id first, in the form Triton gives its own errors
    ("[request id: <id>] ..."); without an id the message is unchanged."""
    with pytest.raises(InferenceServerException) as info:
        _embed(triton_server, protocol, [b"fine", b"\xff"], request_id="req-42")
    assert info.value.message().startswith("[request id: req-42] TEXT[1] is not valid UTF-8"), info.value.message()
    with pytest.raises(InferenceServerException) as info:
        _embed(triton_server, protocol, [b"\xff"])
    assert info.value.message().startswith("TEXT[0] is not valid UTF-8"), info.value.message()


def test_a_long_request_id_or_parameter_value_comes_back_cut_short_with_the_real_error(triton_server):
    """gRPC clients refuse an error message past 8 KiB (its header), and answer RESOURCE_EXHAUSTED instead of the
    real code. Invariant: a 100,000-character request id and a 50,000-character fastpath_priority still get their
    INVALID_ARGUMENT, with the id cut to 200 characters and the value to 80, each with its length."""
    module, client = _client(triton_server, "grpc")
    data = np.array([[b"\xff"]], dtype=np.object_)
    tensor = module.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [tensor], request_id="r" * 100_000)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value.message()
    assert info.value.message().startswith("[request id: " + "r" * 200 + "... (cut; 100000 characters in all)] TEXT[0] is not valid UTF-8")
    tensor.set_data_from_numpy(np.array([[b"fine"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [tensor], parameters={"fastpath_priority": "9" * 50_000})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value.message()
    assert "(cut; 50002 characters in all) is a string" in info.value.message() and len(info.value.message()) < 1000


def test_zero_sized_binary_request_gets_400(triton_server):
    """A zero-sized [0, 1] BYTES tensor through gRPC is refused with INVALID_ARGUMENT naming the tensor, by
    Triton 2.51 itself before the model (its wording; the model's own zero-size check is the backstop)."""
    module, client = _client(triton_server, "grpc")
    tensor = module.InferInput("TEXT", [0, 1], "BYTES")
    tensor.set_data_from_numpy(np.empty((0, 1), dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [tensor])
    assert "inference input 'TEXT'" in info.value.message() and "got 0" in info.value.message()
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


ZERO_SIZED = {  # shape -> what Triton's refusal says about it
    (0, 1): "got 0",
    (1, 0): "Expected [-1,1], got [1,0]",
}


def _send_zero_sized(server, protocol, shape):
    """A BYTES TEXT tensor of ``shape`` (one dimension 0), binary data over HTTP; the refusal it gets."""
    module, client = _client(server, protocol)
    tensor = module.InferInput("TEXT", list(shape), "BYTES")
    if protocol == "http":
        tensor.set_data_from_numpy(np.empty(shape, dtype=np.object_), binary_data=True)
    else:
        tensor.set_data_from_numpy(np.empty(shape, dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [tensor])
    return info.value


def _health_ready_status(server) -> int:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as reply:
        return reply.status


@pytest.mark.parametrize(("protocol", "shape"), [("http", (0, 1)), ("grpc", (1, 0))])
def test_zero_sized_tensor_gets_400_naming_the_tensor(triton_server, protocol, shape):
    """TEXT of shape [0, 1] as HTTP binary data, and [1, 0] over gRPC, is refused with 400 /
    INVALID_ARGUMENT (not 413 or 500) naming the input TEXT and the size it got; the server stays ready."""
    error = _send_zero_sized(triton_server, protocol, shape)
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT"), error
    assert "input 'TEXT'" in error.message() and ZERO_SIZED[shape] in error.message(), error.message()
    assert _health_ready_status(triton_server) == 200


def test_zero_sized_requests_among_good_ones_fail_alone(triton_server, reference, sentences):
    """20 zero-sized requests ([0, 1] and [1, 0], HTTP and gRPC) sent concurrently with 20 one-text
    requests: every zero-sized one gets 400 / INVALID_ARGUMENT, every good one 200 with cosine >= 0.9999
    against sentence-transformers, and /v2/health/ready answers 200 afterwards."""
    good = sentences[:20]
    expected = reference(good)
    jobs = []  # (protocol, index, zero-sized?): each protocol sends both shapes, interleaved with good requests
    for i in range(20):
        jobs += [(("http", "grpc")[i % 2], i, True), (("grpc", "http")[i % 2], i, False)]

    def send(job):
        protocol, index, zero = job
        if zero:
            return _send_zero_sized(triton_server, protocol, list(ZERO_SIZED)[index // 2 % 2])
        return _embed(triton_server, protocol, [good[index]])[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, jobs))
    for (_, index, zero), outcome in zip(jobs, results):
        if zero:
            assert outcome.status() in ("400", "StatusCode.INVALID_ARGUMENT"), outcome
            assert "input 'TEXT'" in outcome.message(), outcome.message()
        else:
            assert float(_cosine(outcome, expected[index : index + 1])[0]) >= 0.9999
    assert _health_ready_status(triton_server) == 200


def test_too_many_texts_gets_400(triton_server):
    with pytest.raises(InferenceServerException) as info:
        _embed(triton_server, "http", ["x"] * 65)
    assert info.value.status() == "400" and "batch-size must be <= 64" in info.value.message()


def test_mixed_good_and_bad_concurrently(triton_server, reference, sentences):
    """200 mixed requests over HTTP and gRPC: good ones correct, bad ones 400, server still ready."""
    good = sentences[:100]
    expected = reference(good)
    jobs = []
    for i in range(200):
        protocol = "http" if i % 2 else "grpc"
        jobs.append((protocol, i // 2, i % 4 == 3))  # every fourth request is bad (invalid UTF-8)

    def send(job):
        protocol, index, bad = job
        try:
            texts = [good[index].encode(), b"\xc3\x28"] if bad else [good[index]]
            return job, _embed(triton_server, protocol, texts)[0], None
        except InferenceServerException as exc:
            return job, None, exc

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, jobs))
    for (_protocol, index, bad), embedding, error in results:
        if bad:
            assert error is not None and error.status() in ("400", "StatusCode.INVALID_ARGUMENT")
            assert "TEXT[1] is not valid UTF-8" in error.message()
        else:
            assert error is None, error
            assert float(_cosine(embedding, expected[index : index + 1])[0]) >= 0.9999
    assert triton_server.is_ready()
    log = triton_server.log_path.read_text()
    assert log.count("TRITONBACKEND_ModelInstanceInitialize: text_embedding_0_0") == 1 and "Stub process" not in log
