"""The blocking client: :class:`Client`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from fastpath_client import detection
from fastpath_client._core import (
    ADMIN_MODEL,
    DETECTION_MODEL,
    EMBEDDING_MODEL,
    EMBEDDING_OUTPUT,
    LOG,
    MUTATING_COMMANDS,
    TEXT_INPUT,
    ClientCore,
    collect,
    grpc_channel_args,
    index_state,
    items_from,
    unrestricted_state,
)
from fastpath_client.checks import inference_version, model_version
from fastpath_client.errors import (
    FastPathClientError,
    InvalidInputError,
    PermissionDeniedError,
    ProtocolMismatchError,
    RequestTimeoutError,
)
from fastpath_client.retry import call_with_retry
from fastpath_client.tensors import ModelSpec, model_spec, model_statistics, repository_versions, text_sequence

T = TypeVar("T")
MAX_HTTP_POOLS = 8


class Client(ClientCore):
    """Blocking FastPath client over Triton's HTTP or gRPC endpoint.

    Each call is retried on :class:`~fastpath_client.errors.UnavailableError` (503, UNAVAILABLE, connection
    refused, model still loading) with the client's :class:`~fastpath_client.RetryPolicy`, and each attempt
    is bounded by ``timeout_s`` (the call's, else the client's). Errors are
    :class:`~fastpath_client.errors.FastPathClientError` subclasses carrying the server's message.

    Over HTTP an instance is not thread-safe (like ``tritonclient.http``): use one per thread, or
    :class:`~fastpath_client.AsyncClient` for concurrency. See :class:`~fastpath_client._core.ClientCore`
    for the constructor arguments; ``sleep`` is injectable for tests.

    Example:
        >>> with Client("localhost:8000") as client:
        ...     client.embed(["A quick brown fox."]).shape
        (1, 384)
    """

    def __init__(self, url: str = "localhost:8000", protocol: str = "http", *,
                 sleep: Callable[[float], None] = time.sleep, **options: Any) -> None:
        super().__init__(url, protocol, **options)
        self._sleep = sleep
        self._clients: dict[float, Any] = {}

    # -- transport -------------------------------------------------------------------------------------

    def _triton(self, timeout_s: float) -> Any:
        """The tritonclient client for this timeout (HTTP timeouts are per client; gRPC's are per call)."""
        key = timeout_s if self.protocol == "http" else 0.0
        if key not in self._clients:
            if len(self._clients) >= MAX_HTTP_POOLS:  # many distinct timeouts: drop the oldest pool
                self._clients.pop(next(iter(self._clients))).close()
            if self.protocol == "http":
                import tritonclient.http as httpclient

                self._clients[key] = httpclient.InferenceServerClient(
                    self.url, connection_timeout=timeout_s, network_timeout=timeout_s)
            else:
                import tritonclient.grpc as grpcclient

                self._clients[key] = grpcclient.InferenceServerClient(self.url, channel_args=grpc_channel_args())
        return self._clients[key]

    def _call(self, model: str | None, operation: Callable[[Any, dict], T], timeout_s: float | None = None,
              *, retry: bool = True) -> T:
        """Run ``operation(triton_client, timeout_kwargs)`` with error mapping and retries."""
        timeout = self._timeout(timeout_s)
        backoff = self._backoff(timeout)

        def attempt() -> T:
            # gRPC: the call deadline is what is left of the timeout; HTTP: a pool per timeout value
            kwargs = {"client_timeout": backoff.remaining_s()} if self.protocol == "grpc" else {}
            try:
                return operation(self._triton(timeout), kwargs)
            except Exception as exc:
                raise self._error(exc, model, timeout) from exc

        if not retry:
            return attempt()
        return call_with_retry(attempt, backoff, sleep=self._sleep, on_retry=self._retried)

    # -- server and model state ------------------------------------------------------------------------

    def ready(self, model: str | None = None, *, timeout_s: float | None = None) -> bool:
        """Whether the server (and ``model``, when given) is ready; False when unreachable. Never raises."""
        try:
            return self._ready(model, timeout_s)
        except FastPathClientError:
            return False

    def _ready(self, model: str | None, timeout_s: float | None) -> bool:
        """:meth:`ready`, except that a :class:`~fastpath_client.errors.ProtocolMismatchError` is raised."""
        try:
            if model is None:
                return bool(self._call(None, lambda c, kw: c.is_server_ready(**kw), timeout_s, retry=False))
            return bool(self._call(model, lambda c, kw: c.is_model_ready(model, **kw), timeout_s, retry=False))
        except ProtocolMismatchError:
            raise
        except FastPathClientError:
            return False

    def wait_ready(self, timeout_s: float = 120.0, models: Sequence[str] = ()) -> None:
        """Block until the server and ``models`` are ready, polling with the retry policy's backoff.

        Polling uses only unrestricted endpoints (server and model readiness). On timeout the message
        gives each model's versions, states and load errors from the repository index when the admin
        key opens it (``FASTPATH_ADMIN_KEY`` / ``admin_key=``), else what the model's metadata tells:
        "not found" or "not ready".

        Raises:
            RequestTimeoutError: not ready after ``timeout_s``; the message names what was not ready (the
                server: unreachable or starting; or each model that is not ready, with its state).
            ProtocolMismatchError: the url answers the other protocol (raised at once: waiting cannot help).
            WrongPortError: the url answers HTTP but not as Triton's API, e.g. its metrics port (whose empty
                200s pass for readiness: the server metadata, which that port does not answer, tells them apart).
        """
        deadline = self._clock() + timeout_s
        poll = 0
        while True:
            waiting = [m for m in ((None,) + tuple(models)) if not self._ready(m, min(5.0, timeout_s))]
            if not waiting:
                if self.protocol == "http":  # raises WrongPortError where only readiness looked like Triton's
                    self._call(None, lambda c, kw: c.get_server_metadata(**kw), 5.0, retry=False)
                return
            now = self._clock()
            if now >= deadline:
                raise RequestTimeoutError(self._not_ready_message(waiting, timeout_s), url=self.url)
            self._sleep(min(self.retry.delay_s(poll, 0.0), max(deadline - now, 0.0)))
            poll += 1

    def _not_ready_message(self, waiting: list[str | None], timeout_s: float) -> str:
        if None in waiting and not self.ready(timeout_s=2.0):
            return self._server_not_ready(timeout_s)
        states: dict[str, str] = {}
        refused = False
        for model in (m for m in waiting if m is not None):
            if not refused:
                try:
                    states[model] = index_state(self._versions(model, 5.0, retry=False))
                    continue
                except FastPathClientError as error:  # 403 without the admin key; the index fails alone
                    refused = isinstance(error, PermissionDeniedError)
            states[model] = unrestricted_state(self._metadata_error(model))
        return self._models_not_ready(states, timeout_s, refused)

    def _metadata_error(self, model: str) -> FastPathClientError | None:
        """What ``get_model_metadata`` (unrestricted) answers for ``model``: None, or the error."""
        try:
            self._call(model, lambda c, kw: c.get_model_metadata(model, **kw), 5.0, retry=False)
        except FastPathClientError as error:
            return error
        return None

    def model_config(self, model: str, *, refresh: bool = False, timeout_s: float | None = None) -> ModelSpec:
        """The model's inputs, outputs and max_batch_size from ``get_model_config`` (cached); ``timeout_s`` bounds the
        fetch like a request's (the client's default when None)."""
        if refresh or model not in self._specs:
            as_json = {} if self.protocol == "http" else {"as_json": True}
            config = self._call(model, lambda c, kw: c.get_model_config(model, **as_json, **kw), timeout_s)
            self._specs[model] = model_spec(config)
        return self._specs[model]

    def versions(self, model: str) -> list[dict[str, str]]:
        """Versions of ``model`` in the repository index: dicts with name, version, state, reason.

        Raises:
            PermissionDeniedError: the server restricts the repository index (``fastpath serve`` does) and
                the admin key is missing or wrong (``FASTPATH_ADMIN_KEY`` / ``admin_key=``).
        """
        return self._versions(model, None, retry=True)

    def _versions(self, model: str, timeout_s: float | None, *, retry: bool) -> list[dict[str, str]]:
        as_json = {} if self.protocol == "http" else {"as_json": True}
        index = self._call(model, lambda c, kw: c.get_model_repository_index(
            headers=self._admin_headers, **as_json, **kw), timeout_s, retry=retry)
        return repository_versions(index, model)

    def statistics(self, model: str) -> dict[str, tuple[int, int]]:
        """Cumulative ``(count, ns)`` per phase (queue, compute_input, compute_infer, ...) of ``model``."""
        as_json = {} if self.protocol == "http" else {"as_json": True}
        stats = self._call(model, lambda c, kw: c.get_inference_statistics(model, **as_json, **kw))
        return model_statistics(stats, model)

    # -- inference -------------------------------------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              version: str = "", timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` (name -> array; object arrays or lists of bytes/str for BYTES).

        Large inputs go through system shared memory per the client's policy; regions are released
        before this returns, whatever happens.

        Returns:
            Output name -> array (``outputs``, or all outputs when None).

        Raises:
            InvalidInputError: refused client-side (numpy S/U arrays; a ``version`` other than "" or an integer >= 1)
                or by the server (400).
            FastPathClientError: the other subclasses, see :mod:`fastpath_client.errors`.
        """
        return self._infer(model, inputs, outputs, version, timeout_s, retry=True)

    def _infer(self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None, version: str,
               timeout_s: float | None, *, retry: bool) -> dict[str, np.ndarray]:
        version = inference_version(version)
        request = self._prepare(model, inputs, outputs)
        return self._call(model, lambda c, kw: self._infer_once(c, kw, model, version, request, outputs), timeout_s,
                          retry=retry)

    def _infer_once(self, triton: Any, kwargs: dict, model: str, version: str, request: Any,
                    names: Sequence[str] | None) -> dict[str, np.ndarray]:
        send = lambda: collect(triton.infer(model, request.inputs, model_version=version,  # noqa: E731
                                            outputs=request.outputs, **kwargs), model, names)
        if not request.deferred or self.shm_refused is not None:
            request.inline()
            return send()
        for name in self._take_pending():
            self._unregister(triton, name, kwargs)
        arrays = [array for _, array in request.deferred]
        region, fresh = self._region_for(arrays)
        if fresh:
            try:
                triton.register_system_shared_memory(region.name, region.key, region.byte_size, **kwargs)
            except Exception as exc:
                region.destroy()
                error = self._error(exc, model, None)
                if not self._shm_fallback(error):
                    raise
                request.inline()
                return send()
            self.counters["shm_registrations"] += 1
        ok = False
        try:
            self._fill(region, request)
            outputs = send()
            ok = True
            return outputs
        finally:
            self._release(triton, self._finish_region(region, ok), kwargs)

    def _release(self, triton: Any, regions: list, kwargs: dict) -> None:
        for region in regions:
            self._unregister(triton, region.name, kwargs)
            region.destroy()

    def _unregister(self, triton: Any, name: str, kwargs: dict) -> None:
        try:
            triton.unregister_system_shared_memory(name, **kwargs)
        except Exception as exc:
            self._unregister_failed(name, exc)

    def _drain_unregister(self, drain_s: float) -> None:
        """Unregister regions the server still used, waiting up to ``drain_s`` for their requests."""
        deadline, poll = self._clock() + drain_s, 0
        kwargs = {"client_timeout": 5.0} if self.protocol == "grpc" else {}
        while self._pending_unregister and self._clients:
            triton = next(iter(self._clients.values()))
            for name in self._take_pending():
                self._unregister(triton, name, kwargs)
            if not self._pending_unregister or self._clock() >= deadline:
                break
            self._sleep(self.retry.delay_s(poll, 0.0))
            poll += 1
        if self._pending_unregister:
            LOG.warning("shared-memory regions %s still registered at %s after %g s", self._pending_unregister,
                        self.url, drain_s)

    def embed(self, texts: Iterable[str | bytes], *, model: str = EMBEDDING_MODEL,
              timeout_s: float | None = None) -> np.ndarray:
        """Sentence embeddings of ``texts``, float32 [N, 384] for all-MiniLM-L6-v2, rows in input order.

        Texts are sent as object arrays of UTF-8 bytes (``bytes`` items as given), in requests of at
        most the model's ``max_batch_size`` (64) texts. Every error that names a text names its index
        in ``texts`` (``TEXT[70]``), whichever request carried it.

        Raises:
            InvalidInputError: ``texts`` is a single string or holds non-text items; or the server refused
                a text (e.g. invalid UTF-8 or too large: the message names the element, as its index in
                ``texts``, and the byte or size).
        """
        texts = text_sequence(texts, name=TEXT_INPUT)
        spec = self.model_config(model, timeout_s=timeout_s)  # a model not ready fails within the call's timeout
        parts = []
        for offset, batch in self._embed_batches(spec, texts):
            with items_from(offset, (TEXT_INPUT,)):
                parts.append(self.infer(model, {TEXT_INPUT: batch}, outputs=[EMBEDDING_OUTPUT],
                                        timeout_s=timeout_s)[EMBEDDING_OUTPUT])
        return self._embed_join(spec, parts, len(texts))

    def detect_text(self, images: Sequence[Any], *, model: str = DETECTION_MODEL,
                    timeout_s: float | None = None) -> list[detection.Detection]:
        """Text boxes in each image (HxWx3 uint8 RGB arrays or encoded PNG/JPEG bytes), one request per image.

        Returns:
            One :class:`~fastpath_client.Detection` per image, in order: boxes float32 [K, 4, 2] in pixel
            coordinates of that image, scores float32 [K].

        Raises:
            InvalidInputError: one image not in a sequence (``detect_text([image])`` is right), an image the
                model cannot take (checked for all images before any is sent), or one the server refused;
                the message names its index in ``images``.
        """
        io, requests = self._detection_plan(self.model_config(model, timeout_s=timeout_s), images)
        found = []
        for index, inputs in enumerate(requests):
            with items_from(index, self._image_inputs(io)):
                found.append(detection.parse_detection(io, model, self.infer(model, inputs, outputs=io.outputs,
                                                                             timeout_s=timeout_s)))
        return found

    # -- model-version control (fastpath_admin) ------------------------------------------------------

    def swap(self, model: str, version: int, *, timeout_s: float = 180.0) -> dict[str, Any]:
        """Make ``version`` of ``model`` the active one on every instance, live (not retried).

        Returns:
            The reply of ``fastpath_admin``: ``active_version``, ``active_versions`` and per-instance state.

        Raises:
            PermissionDeniedError: no or a wrong admin key (``FASTPATH_ADMIN_KEY`` / ``admin_key=``).
            InvalidInputError: ``version`` is not an integer >= 1 (refused before any request: 2.5, True or "2"
                are not coerced), or the model or version is unknown; ServerError: an instance refused the
                version (the message gives its reason; the old version keeps serving).
        """
        return self._admin("swap", model, timeout_s, version=model_version(version))

    def rollback(self, model: str, *, timeout_s: float = 180.0) -> dict[str, Any]:
        """Go back to the version active before the last swap (not retried); errors as :meth:`swap`."""
        return self._admin("rollback", model, timeout_s)

    def status(self, model: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Active version(s) of ``model``, each instance's state and last error, each instance's liveness
        (``progress``: requests in flight, seconds since its last progress, ``stalled``) and the stub
        supervisor's reloads of the model with their causes (``recoveries``), from ``fastpath_admin``."""
        return self._admin("status", model, timeout_s)

    def _admin(self, command: str, model: str, timeout_s: float | None, **fields: Any) -> dict[str, Any]:
        try:
            outputs = self._infer(ADMIN_MODEL, self._admin_request(command, model, **fields), ["RESPONSE"], "",
                                  timeout_s, retry=command not in MUTATING_COMMANDS)
        except InvalidInputError as error:
            raise self._admin_error(error) from error
        return self._admin_reply(command, outputs)

    def close(self, *, drain_s: float = 30.0) -> None:
        """Unregister leftover shared-memory regions (waiting up to ``drain_s`` for requests that
        timed out here but still run on the server), then close the connections (idempotent)."""
        if self._clients:
            kwargs = {"client_timeout": 5.0} if self.protocol == "grpc" else {}
            self._release(next(iter(self._clients.values())), self._pool.drain(), kwargs)
        self._drain_unregister(drain_s)
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
