"""State and request planning shared by :class:`~fastpath_client.Client` and :class:`~fastpath_client.AsyncClient`.

Everything here is free of I/O: the two clients differ only in how they wait (blocking or ``await``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fastpath_client import detection, exit_release
from fastpath_client.checks import host_port, positive_timeout
from fastpath_client.errors import (
    FastPathClientError,
    InvalidInputError,
    ModelNotFoundError,
    ModelNotReadyError,
    PermissionDeniedError,
    ServerError,
    foreign_http_answer,
    from_exception,
)
from fastpath_client.retry import Backoff, OnRetry, RetryPolicy
from fastpath_client.shm import (
    InputRegion,
    RegionPool,
    SharedMemoryMode,
    SharedMemoryPolicy,
    is_local_url,
    new_region,
    packed_bytes,
    size_class,
)
from fastpath_client.tensors import ModelSpec, check_rows, chunks, renumber_items, text_array, typed_empty, wire_array

LOG = logging.getLogger("fastpath_client")
PROTOCOLS = ("http", "grpc")
EMBEDDING_MODEL = "text_embedding"
DETECTION_MODEL = "text_detection"
TEXT_INPUT = "TEXT"
EMBEDDING_OUTPUT = "EMBEDDING"
ADMIN_HEADER = "fastpath-admin-key"  # the header `fastpath serve` restricts Triton's model-repository API to
# Over gRPC Triton 2.51 expects the restricted-protocol key with this prefix (its refusal names the header it
# wanted: "This protocol is restricted, expecting header 'triton-grpc-protocol-fastpath-admin-key'").
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"
ADMIN_KEY_ENV = "FASTPATH_ADMIN_KEY"
ADMIN_MODEL = "fastpath_admin"  # model-version control through Triton's own endpoints
MUTATING_COMMANDS = ("swap", "rollback")


def grpc_channel_args() -> list[tuple[str, Any]]:
    """tritonclient's default channel options plus a reconnect backoff capped at 1 s.

    gRPC's own default grows to 120 s, so a channel that met a server still starting would keep
    failing long after the server came up.
    """
    from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions

    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


@dataclasses.dataclass
class PreparedRequest:
    """tritonclient ``InferInput``/``InferRequestedOutput`` objects for one request.

    Attributes:
        inputs: every InferInput, in the caller's order.
        outputs: requested outputs, or None for all of them.
        deferred: (InferInput, array) pairs chosen for shared memory, not yet given data.
    """

    inputs: list[Any]
    outputs: list[Any] | None
    deferred: list[tuple[Any, np.ndarray]]
    http: bool

    def attach(self, region: InputRegion) -> None:
        """Point the deferred inputs at their place in ``region``."""
        for (tensor, array), offset in zip(self.deferred, region.offsets):
            tensor.set_shared_memory(region.name, array.nbytes, offset)

    def inline(self) -> None:
        """Put the deferred inputs' data in the request body (binary) instead."""
        for tensor, array in self.deferred:
            _set_data(tensor, array, self.http)


def _set_data(tensor: Any, array: np.ndarray, http: bool) -> None:
    if http:
        tensor.set_data_from_numpy(array, binary_data=True)
    else:
        tensor.set_data_from_numpy(array)


def collect(result: Any, model: str, names: Sequence[str] | None) -> dict[str, np.ndarray]:
    """Outputs of an ``InferResult`` as arrays (BYTES outputs as object arrays).

    Raises:
        ServerError: a requested output is missing from the response.
    """
    if names is None:
        response = result.get_response()
        outputs = response["outputs"] if isinstance(response, dict) else response.outputs
        names = [o["name"] if isinstance(o, dict) else o.name for o in outputs]
    arrays = {}
    for name in names:
        array = result.as_numpy(name)
        if array is None:
            raise ServerError(f"model '{model}' sent no output '{name}'")
        arrays[name] = array if array.size else typed_empty(result, name, array)
    return arrays



def index_state(rows: Sequence[Mapping[str, str]]) -> str:
    """A model's state from its rows of the repository index (:meth:`Client.versions`), for messages."""
    if not rows:
        return "not in the repository index (no such model directory)"
    return ", ".join(f"version {row['version'] or '?'} {row['state'] or 'UNKNOWN'}"
                     + (f" ({row['reason']})" if row["reason"] else "") for row in rows)


def unrestricted_state(metadata_error: FastPathClientError | None) -> str:
    """A not-ready model's state as far as the unrestricted API tells, from what its metadata request
    (``GET /v2/models/<name>``, gRPC ``ModelMetadata``) answered: None (it answered) or the error."""
    if metadata_error is None:
        return "not ready (the server knows the model, but no version is ready)"
    message = metadata_error.server_message
    if "no available versions" in message or isinstance(metadata_error, ModelNotReadyError):
        return "not ready (no version is available: still loading, or it failed to load)"
    if "is not found" in message or isinstance(metadata_error, ModelNotFoundError):
        return "not found (the server does not know it: not loaded, unloaded or misspelled)"
    return "not ready"


def renumbered(error: FastPathClientError, tensors: Sequence[str], offset: int) -> FastPathClientError:
    """``error`` as the caller should see it when its request held the caller's items from ``offset`` on:
    the element indexes its message and ``server_message`` give for ``tensors`` are moved up by
    ``offset`` (:func:`~fastpath_client.tensors.renumber_items`). The same error when nothing changes,
    else a new one of the same class, with the same status, url and model."""
    message = renumber_items(str(error), tensors, offset)
    server_message = renumber_items(error.server_message, tensors, offset)
    if message == str(error) and server_message == error.server_message:
        return error
    return type(error)(message, server_message=server_message, status=error.status, url=error.url, model=error.model)


@contextlib.contextmanager
def items_from(offset: int, tensors: Sequence[str]) -> Iterator[None]:
    """Around the request that carries the caller's items from ``offset`` on: a
    :class:`FastPathClientError` raised inside names the caller's item indexes (:func:`renumbered`)."""
    try:
        yield
    except FastPathClientError as error:
        caller = renumbered(error, tensors, offset)
        if caller is error:
            raise
        raise caller from error


class ClientCore:
    """Configuration, caches and request planning common to the sync and async clients.

    Args:
        url: ``host:port`` of Triton's HTTP or gRPC endpoint (no scheme).
        protocol: "http" or "grpc".
        timeout_s: default per-call timeout, seconds: no retry starts after it has passed (an attempt
            gets what is left of it in ``AsyncClient`` and over gRPC, all of it per socket operation
            in the sync HTTP client).
        retry: retry policy for retryable errors (:class:`~fastpath_client.errors.UnavailableError`).
        shared_memory: "auto", "always" or "never" (see :class:`~fastpath_client.shm.SharedMemoryPolicy`).
        shm_threshold_bytes: inputs from this size use shared memory in "auto" mode.
        clock: monotonic clock for retry deadlines.
        on_retry: ``on_retry(retry_number, error, delay_s)`` before each retry.
        admin_key: key for restricted endpoints (the model-repository API); default: the environment
            variable ``FASTPATH_ADMIN_KEY``.

    Raises:
        InvalidInputError: bad protocol, url not ``host:port``, or a timeout (a call's own too) not > 0 s (``checks``).
    """

    def __init__(self, url: str, protocol: str = "http", *, timeout_s: float = 60.0,
                 retry: RetryPolicy | None = None, shared_memory: SharedMemoryMode = "auto",
                 shm_threshold_bytes: int = 1 << 20, clock: Callable[[], float] = time.monotonic,
                 on_retry: OnRetry | None = None, admin_key: str | None = None) -> None:
        if protocol not in PROTOCOLS:
            raise InvalidInputError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        host_port(url)  # raises on a malformed url
        self.url, self.protocol = url, protocol
        self.timeout_s = positive_timeout(timeout_s)
        self.retry = retry or RetryPolicy()
        self.shm_policy = SharedMemoryPolicy(mode=shared_memory, threshold_bytes=shm_threshold_bytes)
        self._local = is_local_url(url)
        self._clock = clock
        self._on_retry = on_retry
        self._specs: dict[str, ModelSpec] = {}
        self._admin_key = os.environ.get(ADMIN_KEY_ENV, "") if admin_key is None else admin_key
        header = ADMIN_HEADER if protocol == "http" else GRPC_RESTRICTED_PREFIX + ADMIN_HEADER
        self._admin_headers = {header: self._admin_key} if self._admin_key else None
        self.shm_refused: str | None = None
        self._pending_unregister: list[str] = []
        self._pool = RegionPool()
        exit_release.track(self._release_at_exit)  # its regions are released at exit if close() never is
        self.counters: collections.Counter[str] = collections.Counter()
        """``retries``, ``shm_requests``, ``shm_bytes``, ``shm_registrations`` so far (for logs and tests)."""

    @property
    def _module(self) -> Any:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        return httpclient if self.protocol == "http" else grpcclient

    def _timeout(self, timeout_s: float | None) -> float:
        """A call's timeout: its own (checked like the client's), else the client's."""
        return self.timeout_s if timeout_s is None else positive_timeout(timeout_s)

    def _backoff(self, timeout_s: float | None = None) -> Backoff:
        """The retry state of one call; with ``timeout_s``, no retry starts after it has passed."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        return Backoff(self.retry, clock=self._clock, call_deadline_s=deadline)

    def _retried(self, retry_number: int, error: FastPathClientError, delay_s: float) -> None:
        self.counters["retries"] += 1
        LOG.info("retry %d in %.3f s after %s", retry_number, delay_s, error)
        if self._on_retry is not None:
            self._on_retry(retry_number, error, delay_s)

    def _error(self, exc: BaseException, model: str | None, timeout_s: float | None) -> FastPathClientError:
        return from_exception(exc, url=self.url, model=model, timeout_s=timeout_s)

    def _server_not_ready(self, timeout_s: float) -> str:
        answer = foreign_http_answer(self.url) if self.protocol == "http" else None
        if answer:
            return f"server {self.url} not ready after {timeout_s:g} s: {answer}"
        return f"server {self.url} not ready after {timeout_s:g} s (unreachable or still starting)"

    def _models_not_ready(self, states: Mapping[str, str], timeout_s: float, index_refused: bool) -> str:
        """The timeout message of ``wait_ready``: each model that is not ready, with its state (from
        :func:`index_state`, or :func:`unrestricted_state` when the repository index was refused)."""
        text = f"models not ready at {self.url} after {timeout_s:g} s: " + "; ".join(
            f"'{model}' {state}" for model, state in states.items())
        if index_refused:
            text += (f" (the repository index, which gives each version's state and load error, needs the admin "
                     f"key: set {ADMIN_KEY_ENV} or pass admin_key=)")
        return text

    def _prepare(self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None) -> PreparedRequest:
        """InferInputs for ``inputs``; large ones are deferred for shared memory per the policy.

        Raises:
            InvalidInputError: an input cannot be sent (numpy S/U array, unsupported dtype, ragged list).
        """
        try:
            return self._build_request(inputs, outputs)
        except FastPathClientError:
            raise
        except Exception as exc:
            raise InvalidInputError(f"model '{model}': cannot build the request: {exc}", model=model) from exc

    def _build_request(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None) -> PreparedRequest:
        module, http = self._module, self.protocol == "http"
        use_shm = self.shm_refused is None
        prepared = PreparedRequest(inputs=[], outputs=None, deferred=[], http=http)
        for name, value in inputs.items():
            array, datatype = wire_array(name, value)
            tensor = module.InferInput(name, list(array.shape), datatype)
            if use_shm and self.shm_policy.selects(array, datatype, local=self._local):
                prepared.deferred.append((tensor, array))
            else:
                _set_data(tensor, array, http)
            prepared.inputs.append(tensor)
        if outputs is not None:
            prepared.outputs = [module.InferRequestedOutput(n, binary_data=True) if http
                                else module.InferRequestedOutput(n) for n in outputs]
        return prepared

    def _unregister_failed(self, name: str, exc: BaseException) -> None:
        """Triton refuses to unregister a region still in use (a request that timed out on our side is
        still running there): keep the name and try again before the next request and in ``close()``."""
        if "in use" in str(exc):
            self._pending_unregister.append(name)
            LOG.debug("shared-memory region %s still in use at %s; unregistering it later", name, self.url)
        else:  # the server may be gone; the local region is unlinked regardless
            LOG.warning("could not unregister shared-memory region %s at %s: %s", name, self.url, exc)

    def _region_for(self, arrays: Sequence[np.ndarray]) -> tuple[InputRegion, bool]:
        """An idle registered region that fits ``arrays``, or a new one (True: register it first)."""
        needed = packed_bytes(arrays)
        region = self._pool.take(needed)
        return (region, False) if region is not None else (new_region(size_class(needed)), True)

    def _fill(self, region: InputRegion, request: PreparedRequest) -> None:
        """Copy the deferred inputs into ``region`` and point the request at them."""
        arrays = [array for _, array in request.deferred]
        region.write(arrays)
        request.attach(region)
        self.counters.update(shm_requests=1, shm_bytes=sum(a.nbytes for a in arrays))

    def _finish_region(self, region: InputRegion, ok: bool) -> list[InputRegion]:
        """After a request: back to the pool if it succeeded; else (Triton may still read it) retire it.
        Returns the regions to unregister and destroy now."""
        if ok:
            return self._pool.give(region)
        return [region]

    def _take_pending(self) -> list[str]:
        names, self._pending_unregister = self._pending_unregister, []
        return names

    def _release_at_exit(self) -> None:  # what close() releases (nothing after it), when the interpreter exits
        exit_release.release(self.url, self.protocol, self._pool.drain(), self._take_pending())

    def _shm_fallback(self, error: FastPathClientError) -> bool:
        """After registering a region failed: True when the server could not map it (another host or
        ``/dev/shm`` namespace, e.g. a container) in "auto" mode; then tensors go inline from now on."""
        cannot_map = isinstance(error, InvalidInputError) or "shared memory" in error.server_message.lower()
        if self.shm_policy.mode == "always" or not cannot_map:
            return False
        self.shm_refused = error.server_message
        LOG.warning("server %s cannot map this host's shared memory (%s); sending tensors in the request body",
                    self.url, error.server_message)
        return True

    def _admin_request(self, command: str, model: str, **fields: Any) -> dict[str, np.ndarray]:
        """The ``REQUEST`` input of one ``fastpath_admin`` command (JSON; the key only for swap/rollback)."""
        document = {"command": command, "model": model, **fields}
        if command in MUTATING_COMMANDS and self._admin_key:
            document["key"] = self._admin_key
        return {"REQUEST": np.array([json.dumps(document).encode()], dtype=np.object_)}

    def _admin_reply(self, command: str, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
        try:
            return json.loads(bytes(outputs["RESPONSE"].reshape(-1)[0]).decode("utf-8"))
        except (KeyError, IndexError, ValueError) as exc:
            raise ServerError(f"{ADMIN_MODEL} at {self.url} sent an unreadable reply to {command}: {exc}") from exc

    def _admin_error(self, error: InvalidInputError) -> FastPathClientError:
        """A missing/wrong key (a 400: Triton 2.51's python backend has no 403) -> PermissionDeniedError; a model the
        repository lacks -> ModelNotFoundError, as inference; no ``fastpath_admin`` loaded -> one saying how to load it."""
        fields = {"server_message": error.server_message, "status": error.status, "url": error.url, "model": error.model}
        if "admin key" in error.server_message or ADMIN_KEY_ENV in error.server_message:
            return PermissionDeniedError(str(error), **fields)
        if not isinstance(error, ModelNotFoundError) and "is not in the model repository" in error.server_message:
            return ModelNotFoundError(str(error), **fields)  # fastpath_admin's 400 for it; inference's is Triton's 404
        if isinstance(error, ModelNotFoundError) and ADMIN_MODEL in error.server_message:
            return ModelNotFoundError(
                f"{error} -- the server at {self.url} does not serve {ADMIN_MODEL}, which swap/rollback/status go "
                f"through: `fastpath serve` loads it by default; with --model, add `--model {ADMIN_MODEL}`", **fields)
        return error

    def _embed_batches(self, spec: ModelSpec, texts: Sequence[str | bytes]) -> list[tuple[int, np.ndarray]]:
        """(offset of the first text in ``texts``, object array) per request of at most ``max_batch_size``.

        The whole of ``texts`` is checked here, before any request, so client-side errors name the
        caller's index; the server's per-text errors are renumbered with the offset (:func:`items_from`).
        """
        spec.input(TEXT_INPUT)
        array = text_array(texts, name=TEXT_INPUT)
        return [(part.start, array[part]) for part in chunks(len(array), spec.max_batch_size)]

    @staticmethod
    def _embed_join(spec: ModelSpec, parts: list[np.ndarray], count: int) -> np.ndarray:
        width = next((o.dims[-1] for o in spec.outputs if o.name == EMBEDDING_OUTPUT and o.dims), -1)
        if not parts:
            return np.zeros((0, max(width, 0)), np.float32)
        joined = np.concatenate(parts).astype(np.float32, copy=False)
        return check_rows(spec.name, EMBEDDING_OUTPUT, joined, count, width if width > 0 else None)

    def _detection_plan(self, spec: ModelSpec, images: Sequence[Any]) -> tuple[detection.DetectionIO, list[dict]]:
        """The detection tensors and one request per image (every image checked before any is sent).
        Request ``i`` carries image ``i``: the server calls it image/element 0, :func:`items_from`
        renumbers that with offset ``i``."""
        detection.check_image_list(images)
        io = detection.detection_io(spec)
        return io, [detection.image_request(io, spec, image, index) for index, image in enumerate(images)]

    @staticmethod
    def _image_inputs(io: detection.DetectionIO) -> tuple[str, ...]:
        return tuple(t.name for t in (io.pixels, io.encoded) if t is not None)
