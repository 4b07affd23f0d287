"""fastpath_client against a real tritonserver serving text_embedding: HTTP and gRPC, sync and async."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time

import numpy as np
import pytest

from fastpath_client import (
    AsyncClient,
    Client,
    InvalidInputError,
    ModelNotFoundError,
    PermissionDeniedError,
    RetryPolicy,
    UnavailableError,
)

pytestmark = pytest.mark.e2e
PROTOCOLS = ["http", "grpc"]
UNICODE_AND_NUL_TEXTS = [" 😃 hello how are you", "🥱", "的人有", "naïve café", "\x00abc", "\ufffd", "abc\x00", ""]


def _url(server, protocol):
    return server.http_url if protocol == "http" else server.grpc_url


def _cosine(a, b):
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _embed(server, protocol, mode, texts, **options):
    """Client(...).embed(texts), or the same through AsyncClient when mode == "async"."""
    if mode == "sync":
        with Client(_url(server, protocol), protocol, **options) as client:
            return client.embed(texts)

    async def run():
        async with AsyncClient(_url(server, protocol), protocol, **options) as client:
            return await client.embed(texts)

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_embed_matches_sentence_transformers_across_chunks(triton_server, reference, sentences, protocol, mode):
    """70 real sentences plus unicode, NUL and empty texts: 2 requests of <= 64 texts, rows in order, float32 [N, 384]."""
    texts = sentences[:70] + UNICODE_AND_NUL_TEXTS
    got = _embed(triton_server, protocol, mode, texts)
    assert got.shape == (len(texts), 384) and got.dtype == np.float32
    assert _cosine(got, reference(texts)).min() >= 0.9999


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_embed_takes_any_iterable_of_texts(triton_server, reference, sentences, mode):
    """A generator, a tuple and a dict's keys embed like the same texts in a list; a non-iterable is refused by name."""
    texts = sentences[:5]
    expected = reference(texts)
    for given in ((text for text in texts), tuple(texts), dict.fromkeys(texts).keys()):
        assert _cosine(_embed(triton_server, "http", mode, given), expected).min() >= 0.9999
    with pytest.raises(InvalidInputError, match="TEXT: expected an iterable of str or bytes, got int"):
        _embed(triton_server, "http", mode, 42)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trailing_nul_is_kept(triton_server, reference, protocol):
    """The client sends "abc\\x00" with its trailing NUL (numpy S would drop it); the server's tokenizer
    drops the NUL, so both texts give 3 tokens. An empty list gives a float32 [0, 384] array."""
    with Client(_url(triton_server, protocol), protocol) as client:
        tokens = client.infer("text_embedding", {"TEXT": np.array([[b"abc\x00"], [b"abc"]], dtype=object)},
                              outputs=["TOKEN_COUNT"])["TOKEN_COUNT"]
        empty = client.embed([])
    assert tokens.reshape(-1).tolist() == [3, 3]  # NUL is stripped by the tokenizer, not by the client
    assert empty.shape == (0, 384) and empty.dtype == np.float32


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_refusal_is_a_readable_invalid_input_error(triton_server, protocol, mode):
    with pytest.raises(InvalidInputError) as info:
        _embed(triton_server, protocol, mode, [b"fine", b"\xff\xfe\xfd"])
    error = info.value
    assert error.status in ("400", "INVALID_ARGUMENT")
    assert "TEXT[1] is not valid UTF-8: byte 0xff" in error.server_message
    assert "text_embedding" in str(error) and _url(triton_server, protocol) in str(error)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_and_single_string(triton_server, protocol):
    with Client(_url(triton_server, protocol), protocol) as client:
        with pytest.raises(ModelNotFoundError, match="'no_such_model' is not found"):
            client.infer("no_such_model", {"TEXT": [[b"x"]]})
        with pytest.raises(InvalidInputError, match="wrap it in a list"):
            client.embed("hello")
        assert client.counters["retries"] == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ready_and_versions(triton_server, protocol):
    with Client(_url(triton_server, protocol), protocol) as client:
        assert client.ready() and client.ready("text_embedding") and not client.ready("no_such_model")
        client.wait_ready(timeout_s=5, models=["text_embedding"])
        assert [(v["version"], v["state"]) for v in client.versions("text_embedding")] == [("1", "READY")]
        before = client.statistics("text_embedding")
        client.embed(["counted once"])
        deadline = time.monotonic() + 10  # Triton records a request's statistics when it is released,
        while time.monotonic() < deadline:  # which may be just after its response went out
            after = client.statistics("text_embedding")
            if after["success"][0] > before["success"][0]:
                break
            time.sleep(0.01)
        assert after["success"][0] == before["success"][0] + 1 and after["compute_infer"][1] > before["compute_infer"][1]


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A broken proxy: 502 with an empty body (or an HTML page) for every request."""

    body = b""

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(502)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(params=[b"", b"<html><body><h1>502 Bad Gateway</h1></body></html>"], ids=["empty", "html"])
def gateway(request):
    handler = type("Gateway", (_Gateway,), {"body": request.param})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", request.param
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_proxy_502_surfaces_as_readable_unavailable_error(gateway, mode):
    url, body = gateway
    retries = []
    options = dict(retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.0, max_backoff_s=0.0),
                   on_retry=lambda n, e, d: retries.append(n))
    inputs = {"TEXT": np.array([[b"hello"]], dtype=object)}
    with pytest.raises(UnavailableError) as info:
        if mode == "sync":
            with Client(url, "http", **options) as client:
                client.infer("text_embedding", inputs)
        else:
            async def run():
                async with AsyncClient(url, "http", **options) as client:
                    await client.infer("text_embedding", inputs)

            asyncio.run(run())
    message = str(info.value)
    assert info.value.status == "502" and retries == [1]
    assert ("empty body" in message and "proxy" in message) if not body else "502 Bad Gateway" in message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_version_control_through_fastpath_admin(triton_server, protocol):
    """status/swap/rollback go to the fastpath_admin model. The test server has no admin
    key, so swaps are refused with a PermissionDeniedError that says why; no retry re-sends them."""
    retries = []
    with Client(_url(triton_server, protocol), protocol, admin_key="",
                on_retry=lambda n, e, d: retries.append(e)) as client:
        status = client.status("text_embedding")
        assert status["model"] == "text_embedding" and "active_versions" in status
        for call in (lambda: client.swap("text_embedding", 1), lambda: client.rollback("text_embedding")):
            with pytest.raises(PermissionDeniedError, match="FASTPATH_ADMIN_KEY"):
                call()
        with pytest.raises(ModelNotFoundError, match="'no_such_model' is not in the model repository"):
            client.status("no_such_model")  # the class inference raises for an unknown model
    assert retries == []


# embed() sends long lists in requests of 64 texts; a refusal names the text's index in the caller's list
# (TEXT[70] for texts[70]), not its index within its request (TEXT[6]).
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("index", "bad", "expected"), [
    (70, b"bad\xff", "TEXT[70] is not valid UTF-8: byte 0xff at offset 3"),
    (140, b"x" * (2 << 20), "TEXT[140] is 2097152 bytes"),
])
def test_errors_name_the_index_in_the_callers_list_across_requests(triton_server, protocol, mode, index, bad, expected):
    texts = [f"sentence {i}" for i in range(150)]
    texts[index] = bad
    with pytest.raises(InvalidInputError) as info:
        _embed(triton_server, protocol, mode, texts, shared_memory="never")
    assert expected in str(info.value) and expected in info.value.server_message
    assert "TEXT[6]" not in str(info.value) and "TEXT[12]" not in str(info.value)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_http_client_on_the_grpc_port_fails_at_once(triton_server, mode):
    """An HTTP client pointed at Triton's gRPC port gets ProtocolMismatchError at once, not a wait_ready
    timeout (not 60 s of "server unreachable or starting"). The other way round Triton 2.51's
    HTTP port closes the connection ("Socket closed"), which a gRPC client cannot tell from a network
    failure: it times out (the CLI adds the port hint)."""
    from fastpath_client import ProtocolMismatchError, RequestTimeoutError

    def wait(url, protocol, timeout_s):
        if mode == "sync":
            with Client(url, protocol) as client:
                client.wait_ready(timeout_s=timeout_s, models=["text_embedding"])
            return

        async def run():
            async with AsyncClient(url, protocol) as client:
                await client.wait_ready(timeout_s=timeout_s, models=["text_embedding"])
        asyncio.run(run())

    start = time.monotonic()
    with pytest.raises(ProtocolMismatchError) as info:
        wait(triton_server.grpc_url, "http", 30)
    assert time.monotonic() - start < 10 and not info.value.retryable
    assert "the reply is not HTTP" in str(info.value) and "default 8000" in str(info.value)
    with pytest.raises(RequestTimeoutError, match="not ready after 1"):
        wait(triton_server.http_url, "grpc", 1.0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_client_on_the_metrics_port_is_told_to_use_the_http_port(triton_server, mode):
    """Triton's metrics port answers an empty HTTP 200 to any GET but /metrics and 405 to a POST, where the
    HTTP API answers JSON. Invariant: wait_ready and a call there raise WrongPortError at once (not retried),
    naming the HTTP port, not a JSON parse error or "HTTP 405 ... Method Not Allowed"; the CLI says the same."""
    from fastpath.cli import main as cli
    from fastpath_client import WrongPortError

    url = f"127.0.0.1:{triton_server.options.metrics_port}"

    def embed():
        if mode == "sync":
            with Client(url, "http") as client:
                return client.embed(["hello"])

        async def run():
            async with AsyncClient(url, "http") as client:
                return await client.embed(["hello"])
        return asyncio.run(run())

    def wait_ready():
        if mode == "sync":
            with Client(url, "http") as client:
                return client.wait_ready(timeout_s=30, models=["text_embedding"])

        async def run():
            async with AsyncClient(url, "http") as client:
                return await client.wait_ready(timeout_s=30, models=["text_embedding"])
        return asyncio.run(run())

    start = time.monotonic()
    with pytest.raises(WrongPortError):
        wait_ready()  # the port's empty 200s pass for readiness; the server metadata tells it apart
    with pytest.raises(WrongPortError) as info:
        embed()
    assert time.monotonic() - start < 10 and not info.value.retryable
    assert f"{url} does not serve Triton's HTTP API" in str(info.value) and "HTTP port (default 8000)" in str(info.value)
    if mode == "sync":
        assert cli.main(["status", "text_embedding", "--url", url]) == 1


def _bench(capsys, *argv):
    from fastpath.cli import main as cli

    start = time.monotonic()
    code = cli.main(["bench", "--no-progress", "--duration-s", "0.3", *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fastpath bench: ")]
    assert "Traceback" not in err and len(lines) == 1, err
    return code, lines[0], time.monotonic() - start


def test_bench_of_an_unknown_model_ends_at_once_with_one_line(triton_server, capsys, tmp_path):
    code, line, elapsed = _bench(capsys, "--model", "nope", "--url", triton_server.http_url, "--out", str(tmp_path))
    assert code == 1 and elapsed < 20 and "'nope'" in line and "not found" in line
    assert not list(tmp_path.iterdir())


def test_bench_on_the_other_protocols_port_ends_with_the_hint(triton_server, capsys, tmp_path):
    code, line, elapsed = _bench(capsys, "--url", triton_server.grpc_url, "--out", str(tmp_path))
    assert code == 1 and elapsed < 20
    assert line.endswith("is --url the HTTP port (default 8000)? for the gRPC port use --protocol grpc")


def test_status_of_a_model_that_is_not_loaded_fails_like_swap(triton_server, capsys):
    """`fastpath status` of a model in the repository but not loaded (text_detection) fails like swap:
    one line and exit 1, not `"instances": {}` and exit 0."""
    from fastpath.cli import main as cli

    assert cli.main(["status", "text_detection", "--url", triton_server.http_url]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastpath status: model text_detection is not loaded at ")
    assert cli.main(["status", "text_embedding", "--url", triton_server.http_url]) == 0



def test_a_call_to_an_unloaded_model_gives_up_within_its_timeout(tmp_path):
    """Invariant: timeout_s bounds the whole call, the model-config fetch that precedes the first request included:
    embed of a model unloaded through the repository API raises ModelNotReadyError after about timeout_s=2 s, over
    HTTP and gRPC, sync and async; the fetch was retried until the retry policy's own 30 s deadline instead."""
    import tritonclient.http as httpclient

    from fastpath_client import AsyncClient, Client
    from fastpath_client.errors import ModelNotReadyError
    from tests.conftest import start_server

    server = start_server(tmp_path, models=("text_embedding",))
    try:
        admin = httpclient.InferenceServerClient(server.http_url)
        admin.unload_model("text_embedding")
        admin.close()
        for protocol in ("http", "grpc"):
            url = _url(server, protocol)
            start = time.monotonic()
            with pytest.raises(ModelNotReadyError), Client(url, protocol) as client:
                client.embed(["x"], timeout_s=2.0)
            assert time.monotonic() - start < 10, protocol

            async def run(url=url, protocol=protocol):
                async with AsyncClient(url, protocol) as client:
                    await client.embed(["x"], timeout_s=2.0)
            start = time.monotonic()
            with pytest.raises(ModelNotReadyError):
                asyncio.run(run())
            assert time.monotonic() - start < 10, f"async {protocol}"
    finally:
        server.stop()
