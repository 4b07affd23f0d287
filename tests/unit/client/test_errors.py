"""Mapping transport exceptions to FastPathClientError subclasses, with readable messages."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from fastpath_client import errors

URL = "127.0.0.1:8000"


def _map(exc, model="text_embedding"):
    return errors.from_exception(exc, url=URL, model=model, timeout_s=2.5)


@pytest.mark.parametrize(
    ("status", "message", "cls"),
    [
        ("400", "TEXT[1] is not valid UTF-8: byte 0xff", errors.InvalidInputError),
        ("StatusCode.INVALID_ARGUMENT", "TEXT[1] is not valid UTF-8: byte 0xff", errors.InvalidInputError),
        ("413", "request body too large", errors.InvalidInputError),
        ("404", "Request for unknown model: 'nope' is not found", errors.ModelNotFoundError),
        ("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found", errors.ModelNotFoundError),
        ("StatusCode.NOT_FOUND", "Request for unknown model: 'm' has no available versions", errors.ModelNotReadyError),
        ("503", "queue full; retry later", errors.UnavailableError),
        ("StatusCode.UNAVAILABLE", "failed to connect to all addresses; Connection refused", errors.ServerConnectionError),
        ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", errors.RequestTimeoutError),
        ("StatusCode.RESOURCE_EXHAUSTED", "Received message larger than max (99 vs. 4)", errors.InvalidInputError),
        ("500", "boom", errors.ServerError),
        ("503", "Exceeds maximum queue size: 1024 texts queued + 64 in this request > max_queue_texts=1024",
         errors.ServerBusyError),
        ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size", errors.ServerBusyError),
        ("500", "Stub process 'text_embedding_0_0' is not healthy.", errors.ModelRestartingError),
        ("StatusCode.INTERNAL", "Stub process 'text_embedding_0_0' is not healthy.", errors.ModelRestartingError),
        ("StatusCode.INTERNAL", "Failed to process the request(s) for model 'm', message: boom", errors.ServerError),
    ],
)
def test_server_statuses_map_to_classes_with_the_server_message(status, message, cls):
    error = _map(InferenceServerException(msg=message, status=status))
    assert type(error) is cls
    assert isinstance(error, errors.FastPathClientError)
    assert error.server_message == message and message in str(error)
    assert error.status == status.removeprefix("StatusCode.")
    assert URL in str(error) and "text_embedding" in str(error)
    assert error.retryable == issubclass(cls, errors.UnavailableError)
    # busy, loading and restarting answers are retried until the deadline; other retryable ones up to max_attempts
    assert error.until_deadline == issubclass(cls, (errors.ServerBusyError, errors.ModelNotReadyError))


def test_empty_body_from_a_proxy_is_explained():
    error = _map(InferenceServerException(msg=errors.EMPTY_BODY_MESSAGE, status="502"))
    assert isinstance(error, errors.UnavailableError) and error.status == "502"
    assert "empty body" in str(error) and "proxy" in str(error) and "HTTP 502" in str(error)


def test_non_json_body_shows_a_snippet():
    body = "<html><body><h1>502 Bad Gateway</h1>\n</body></html>"
    exc = InferenceServerException(
        msg=f"an exception occurred in the client while decoding the response: Parse error\nresponse: {body}",
        status="502", debug_details=body)
    error = _map(exc)
    assert isinstance(error, errors.UnavailableError)
    assert "502 Bad Gateway" in str(error) and "not Triton's JSON" in str(error)


@pytest.mark.parametrize("exc", [ConnectionRefusedError(111, "Connection refused"), ConnectionResetError(104, "reset")])
def test_connection_failures_are_retryable_connection_errors(exc):
    error = _map(exc)
    assert isinstance(error, errors.ServerConnectionError) and isinstance(error, ConnectionError)
    assert error.retryable and "is tritonserver running" in str(error)


@pytest.mark.parametrize("exc", [TimeoutError("timed out"), TimeoutError()])
def test_timeouts_name_the_limit(exc):
    error = _map(exc)
    assert isinstance(error, errors.RequestTimeoutError) and isinstance(error, TimeoutError)
    assert "2.5 s" in str(error) and not error.retryable


def test_aiohttp_connection_errors_by_class_name():
    import aiohttp

    error = _map(aiohttp.ServerDisconnectedError())
    assert isinstance(error, errors.ServerConnectionError)


def test_a_client_error_passes_through_unchanged():
    original = errors.InvalidInputError("bad")
    assert _map(original) is original


@pytest.mark.parametrize("message", [
    # Triton's HTTP server answers the gRPC client's HTTP/2 preface with an HTTP/1 400
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:8000: "
    "Trying to connect an http1.x server (HTTP status 400)",
    # a server that answers HTTP/1 bytes without a status gRPC understands
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:8000: Failed parsing HTTP/2 "
    "(Expected SETTINGS frame as the first frame, got frame type 79)",
])
def test_a_grpc_client_on_the_http_port_is_a_protocol_mismatch(message):
    error = _map(InferenceServerException(msg=message, status="StatusCode.UNAVAILABLE"))
    assert type(error) is errors.ProtocolMismatchError and isinstance(error, errors.ServerConnectionError)
    assert not error.retryable and error.server_message == message and error.status == "UNAVAILABLE"
    assert str(error).startswith(f"model 'text_embedding' at {URL}: the reply is not gRPC (failed to connect")
    assert str(error).endswith(f"{URL} looks like Triton's HTTP port; use its gRPC port (default 8001), "
                               "or protocol='http' for this one")


def test_an_http_client_on_the_grpc_port_is_a_protocol_mismatch():
    from geventhttpclient._parser import HTTPParseError

    error = _map(HTTPParseError("Expected HTTP/, RTSP/ or ICE/", 8))
    assert type(error) is errors.ProtocolMismatchError and not error.retryable
    assert str(error) == (f"model 'text_embedding' at {URL}: the reply is not HTTP (HTTPParseError: Expected HTTP/, "
                          f"RTSP/ or ICE/): {URL} looks like Triton's gRPC port; use its HTTP port (default 8000), "
                          "or protocol='grpc' for this one")
    truncated = _map(HTTPParseError("invalid chunk size", 3))  # another parse failure stays a connection error
    assert type(truncated) is errors.ServerConnectionError and truncated.retryable


def test_a_405_or_an_empty_200_is_a_wrong_port_naming_the_http_port():
    """The client sends each endpoint's own method and Triton's HTTP API answers JSON, so HTTP 405 or an empty
    body where JSON is due means the port is not the API (Triton's metrics port answers both ways). Invariant:
    WrongPortError (a ProtocolMismatchError, not retried) whose message names the HTTP and gRPC ports."""
    import rapidjson

    not_allowed = _map(InferenceServerException(msg="Method Not Allowed", status="405"))
    try:
        rapidjson.loads("")
    except rapidjson.JSONDecodeError as exc:
        empty = _map(exc)
    for error, answered in ((not_allowed, "HTTP 405 Method Not Allowed"), (empty, "an empty HTTP 200 where Triton answers JSON")):
        assert type(error) is errors.WrongPortError and isinstance(error, errors.ProtocolMismatchError)
        assert not error.retryable and error.server_message == answered
        assert str(error) == (f"model 'text_embedding' at {URL}: {URL} does not serve Triton's HTTP API (it answered "
                              f"{answered}, as Triton's metrics port does); use its HTTP port (default 8000), or "
                              "protocol='grpc' with its gRPC port (default 8001)")
