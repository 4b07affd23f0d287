"""Client exceptions: one root, ``FastPathClientError``, with typed subclasses.

Every error carries the server's own message (``server_message``), the status it came with
(``status``: ``"400"`` over HTTP, ``"INVALID_ARGUMENT"`` over gRPC, ``None`` when no server answered),
the server address and the model. :func:`from_exception` turns what tritonclient, geventhttpclient,
aiohttp and grpc raise into one of these.

Status mapping (KServe v2 over HTTP / gRPC):

==========================  ===========================================  ======================
class                       HTTP / gRPC status                           retried by the client
==========================  ===========================================  ======================
InvalidInputError           400, 413 / INVALID_ARGUMENT, RESOURCE_EXHAUSTED  no
ModelNotFoundError          404 "is not found"                           no
PermissionDeniedError       403 / PERMISSION_DENIED (restricted API)     no
ModelNotReadyError          404 / NOT_FOUND "has no available versions"  yes, until the deadline (loading)
ModelRestartingError        500 / INTERNAL "Stub process ... is not      yes, until the deadline
                            healthy" (an instance being reloaded)
UnavailableError            502, 503 / UNAVAILABLE                       yes
ServerBusyError             503 / UNAVAILABLE "Exceeds maximum queue     yes, until the deadline
                            size" (the server's queue is full)
ServerConnectionError       connection refused / reset                   yes
ProtocolMismatchError       the port answers the other protocol          no
WrongPortError              the port answers HTTP, not Triton's API      no
                            (405, or an empty 200: the metrics port)
RequestTimeoutError         504 / DEADLINE_EXCEEDED, client timeout      no
ServerError                 500 and anything else                        no
==========================  ===========================================  ======================
"""

from __future__ import annotations

import asyncio
import re
import socket

EMPTY_BODY_MESSAGE = "client received an empty response from the server."
_DECODE_FAILURE = "an exception occurred in the client while decoding the response"


class FastPathClientError(Exception):
    """Root of every exception the FastPath client raises.

    Attributes:
        server_message: the message the server (or the transport) gave, verbatim.
        status: ``"400"``-style HTTP status or gRPC status name without ``StatusCode.``; None when no
            response came back.
        url: the server address the client talked to.
        model: the model of the call, or None.
        retryable: whether the client's retry policy retries this error.
        until_deadline: a retryable error that is retried until the call's deadline without counting
            towards ``RetryPolicy.max_attempts``: the server is busy or restarting, and says so.
    """

    retryable = False
    until_deadline = False

    def __init__(self, message: str, *, server_message: str = "", status: str | None = None,
                 url: str = "", model: str | None = None) -> None:
        super().__init__(message)
        self.server_message = server_message or message
        self.status = status
        self.url = url
        self.model = model


class InvalidInputError(FastPathClientError, ValueError):
    """The request was refused as invalid (HTTP 400/413, gRPC INVALID_ARGUMENT), or failed client-side checks."""


class ModelNotFoundError(InvalidInputError):
    """The server does not know the model (HTTP 404 "unknown model ... is not found")."""


class PermissionDeniedError(FastPathClientError, PermissionError):
    """A restricted endpoint (e.g. the model-repository API) refused the call: set ``FASTPATH_ADMIN_KEY``."""


class UnavailableError(FastPathClientError):
    """The server cannot take the request now (HTTP 502/503, gRPC UNAVAILABLE); retried with backoff."""

    retryable = True


class ServerBusyError(UnavailableError):
    """The server's queue is full ("Exceeds maximum queue size", Triton's wording, FastPath's too):
    back-pressure. Retried with backoff until the call's deadline, however many attempts that takes."""

    until_deadline = True


class ModelNotReadyError(UnavailableError):
    """The model exists but has no ready version (loading, or failed to load): retried with backoff until
    the call's deadline, as a load (or the unload and load of a reload) takes seconds."""

    until_deadline = True


class ModelRestartingError(ModelNotReadyError):
    """An instance of the model has no healthy backend process: Triton 2.51 answers HTTP 500 / INTERNAL
    "Stub process '<instance>' is not healthy." while a crashed python-backend stub is being reloaded
    (``fastpath serve`` reloads it; then "no available versions" until the load ends). Inference is
    idempotent and the dead stub never answers the request, so it is retried with backoff until the
    call's deadline."""


class ServerConnectionError(UnavailableError, ConnectionError):
    """No connection to the server (refused, reset, closed early); retried with backoff."""


class ProtocolMismatchError(ServerConnectionError):
    """The port answered, but not in the client's protocol: an HTTP client on Triton's gRPC port (the
    reply is not HTTP) or a gRPC client on its HTTP port. Not retried: waiting does not change what a
    port speaks. The message says which port and ``protocol`` to use."""

    retryable = False


class WrongPortError(ProtocolMismatchError):
    """The port answers HTTP, but not Triton's HTTP API: HTTP 405 to an inference POST, or an empty HTTP 200
    where the API answers JSON. Triton's metrics port (default 8002) answers so (seen with Triton 2.51). Not
    retried; the message names the HTTP (8000) and gRPC (8001) ports."""


class RequestTimeoutError(FastPathClientError, TimeoutError):
    """The call did not finish within its ``timeout_s`` (or a gateway answered 504); not retried."""


class ServerError(FastPathClientError, RuntimeError):
    """The server failed while handling the request (HTTP 500, gRPC INTERNAL or another status)."""


_HTTP_CLASSES = {"400": InvalidInputError, "403": PermissionDeniedError, "413": InvalidInputError, "502": UnavailableError,
                 "503": UnavailableError, "504": RequestTimeoutError}
_GRPC_CLASSES = {"INVALID_ARGUMENT": InvalidInputError, "UNAVAILABLE": UnavailableError,
                 "DEADLINE_EXCEEDED": RequestTimeoutError, "NOT_FOUND": ModelNotReadyError,
                 "PERMISSION_DENIED": PermissionDeniedError, "UNAUTHENTICATED": PermissionDeniedError}


def _where(url: str, model: str | None) -> str:
    return f"model '{model}' at {url}" if model else f"server {url}"


# What tritonclient's transports report when the other protocol answers: geventhttpclient and aiohttp
# parsing an HTTP/2 (gRPC) frame as an HTTP/1 status line; gRPC reading an HTTP/1 reply as HTTP/2.
_NOT_HTTP = ("Expected HTTP/", "Bad status line")
_NOT_GRPC = ("Failed parsing HTTP/2", "http1.x server", "Expected SETTINGS frame")
DEFAULT_PORTS = {"HTTP": 8000, "gRPC": 8001}


def _mismatch(url: str, model: str | None, got: str, reply: str, status: str | None = None) -> ProtocolMismatchError:
    """A :class:`ProtocolMismatchError`: ``url`` answered in protocol ``got`` ("HTTP" or "gRPC"), not the client's."""
    wanted = "HTTP" if got == "gRPC" else "gRPC"
    detail = " ".join(reply.split("b'", 1)[0].split()).rstrip(":")[:200]  # without the raw frame bytes
    text = (f"{_where(url, model)}: the reply is not {wanted} ({detail}): {url} looks like Triton's {got} port; "
            f"use its {wanted} port (default {DEFAULT_PORTS[wanted]}), or protocol='{got.lower()}' for this one")
    return ProtocolMismatchError(text, server_message=reply, status=status, url=url, model=model)


def _wrong_port(url: str, model: str | None, answered: str, status: str | None = None) -> WrongPortError:
    """A :class:`WrongPortError`: ``url`` answered HTTP (``answered`` says how), but not as Triton's HTTP API."""
    text = (f"{_where(url, model)}: {url} does not serve Triton's HTTP API (it answered {answered}, as Triton's "
            f"metrics port does); use its HTTP port (default {DEFAULT_PORTS['HTTP']}), or protocol='grpc' with its "
            f"gRPC port (default {DEFAULT_PORTS['gRPC']})")
    return WrongPortError(text, server_message=answered, status=status, url=url, model=model)


QUEUE_FULL = "Exceeds maximum queue size"
CONNECTION_QUESTION = "is tritonserver running and listening there?"  # ends every ServerConnectionError's message
STUB_UNHEALTHY = re.compile(r"Stub process '[^']*' is not healthy")


def _class_for(status: str, message: str) -> type[FastPathClientError]:
    if status in ("500", "INTERNAL") and STUB_UNHEALTHY.search(message):
        return ModelRestartingError
    if status in ("503", "UNAVAILABLE") and QUEUE_FULL in message:
        return ServerBusyError
    if status in ("404", "NOT_FOUND"):
        return ModelNotReadyError if "no available versions" in message else ModelNotFoundError
    if status == "RESOURCE_EXHAUSTED":  # message too large vs. a server out of capacity
        return InvalidInputError if "larger than max" in message or "limit" in message else UnavailableError
    if status == "UNAVAILABLE" and "failed to connect" in message.lower():
        return ServerConnectionError
    if "protocol is restricted" in message or "API is restricted" in message:
        # Triton 2.51 refuses a restricted endpoint without its key as gRPC UNAVAILABLE: not retryable
        return PermissionDeniedError
    return _HTTP_CLASSES.get(status) or _GRPC_CLASSES.get(status) or ServerError


def _from_server(exc, url: str, model: str | None) -> FastPathClientError:
    """Map a ``tritonclient.utils.InferenceServerException``."""
    raw_status = exc.status()
    status = None if raw_status is None else str(raw_status).removeprefix("StatusCode.")
    message = exc.message() or ""
    details = exc.debug_details() or ""
    where = _where(url, model)
    if status == "UNAVAILABLE" and any(marker in message for marker in _NOT_GRPC):
        return _mismatch(url, model, "HTTP", message, status)
    if status == "405":  # the client sends each endpoint's own method: a 405 is not Triton's HTTP API answering
        return _wrong_port(url, model, f"HTTP 405 {message}".strip(), status)
    if message == EMPTY_BODY_MESSAGE:
        text = (f"HTTP {status} with an empty body from {where}: something between the client and Triton "
                "(a proxy or load balancer) answered, not Triton itself; check that proxy and its upstream")
    elif message.startswith(_DECODE_FAILURE):
        snippet = " ".join(str(details).split())[:200]
        text = (f"HTTP {status} from {where} with a body that is not Triton's JSON error "
                f"(a proxy answered?): {snippet!r}")
    else:
        label = f"HTTP {status}" if status and status.isdigit() else (status or "error")
        text = f"{label} from {where}: {message}"
    cls = _class_for(status or "", message)
    if cls is ServerConnectionError:  # gRPC's "failed to connect": the same question the HTTP transport's failure asks
        text += f"; {CONNECTION_QUESTION}"
    return cls(text, server_message=message or str(details), status=status, url=url, model=model)


def from_exception(exc: BaseException, *, url: str, model: str | None = None,
                   timeout_s: float | None = None) -> FastPathClientError:
    """Turn an exception raised by a transport into a :class:`FastPathClientError`.

    Args:
        exc: what tritonclient (``InferenceServerException``), geventhttpclient, aiohttp or asyncio raised.
        url: the server address, for the message.
        model: the model of the call, for the message.
        timeout_s: the call's timeout, named in timeout messages.

    Returns:
        The mapped error; ``exc`` itself when it already is a ``FastPathClientError``.
    """
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, FastPathClientError):
        return exc
    where = _where(url, model)
    if isinstance(exc, InferenceServerException):
        return _from_server(exc, url, model)
    if isinstance(exc, (TimeoutError, socket.timeout, asyncio.TimeoutError)) or "Timeout" in type(exc).__name__:
        limit = f" of {timeout_s:g} s" if timeout_s is not None else ""
        return RequestTimeoutError(f"{where}: no response within the timeout{limit}; raise timeout_s or check the "
                                   f"server's queue ({type(exc).__name__})", url=url, model=model)
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(getattr(exc, "message", "") or (exc.args[0] if exc.args else exc))
    if names & {"HTTPParseError", "ClientResponseError"} and any(marker in text for marker in _NOT_HTTP):
        return _mismatch(url, model, "gRPC", f"{type(exc).__name__}: {text}")
    if "JSONDecodeError" in names and "empty" in text:  # HTTP 200 with no body where Triton's API answers JSON
        return _wrong_port(url, model, "an empty HTTP 200 where Triton answers JSON")
    if isinstance(exc, OSError) or names & {"HTTPConnectionClosed", "HTTPParseError", "ClientConnectionError"}:
        return ServerConnectionError(f"{where}: connection failed: {type(exc).__name__}: {exc}; {CONNECTION_QUESTION}",
                                     server_message=str(exc), url=url, model=model)
    return FastPathClientError(f"{where}: {type(exc).__name__}: {exc}", url=url, model=model)


def foreign_http_answer(url: str) -> str | None:
    """What answered ``GET http://<url>/v2/health/ready`` when it was not Triton (a proxy's 404, another
    service), or None: no answer, or Triton's own not-ready answer (HTTP 400, empty body)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2.0) as reply:
            code, reason, headers, body = reply.status, reply.reason, reply.headers, reply.read(200)
    except urllib.error.HTTPError as exc:
        code, reason, headers, body = exc.code, exc.reason, exc.headers, exc.read(200)
    except (OSError, ValueError):
        return None
    if code in (200, 400) and not body.strip():
        return None
    server = f", Server: {headers.get('Server')}" if headers.get("Server") else ""
    text = " ".join(body.decode("utf-8", "replace").split())[:120]
    return (f"GET /v2/health/ready was answered HTTP {code} {reason}{server}" + (f" ({text!r})" if text else "")
            + ", which is not Triton's readiness answer; is the URL Triton's HTTP port, not a proxy or another service?")
