"""The asyncio client: :class:`AsyncClient` (``tritonclient.http.aio`` / ``tritonclient.grpc.aio``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
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
from fastpath_client.flow import fan_out, run_bounded
from fastpath_client.retry import acall_with_retry
from fastpath_client.tensors import ModelSpec, model_spec, model_statistics, repository_versions, text_sequence

T = TypeVar("T")


class AsyncClient(ClientCore):
    """The awaitable twin of :class:`~fastpath_client.Client`: same methods, same errors, same retries.

    Calls may run concurrently on one instance (``asyncio.gather``). At most ``max_in_flight``
    inference requests are in flight at once across all of them; the rest wait in the client, in
    order. ``embed`` sends its chunks and ``detect_text`` its images concurrently, never more at once
    than that bound or than the server's queue holds (the model config's ``max_queue_texts`` /
    ``max_queue_size``), and no request of theirs outlives the call (an error or a cancellation
    cancels the others). A request's ``timeout_s`` runs from when it gets its slot and bounds its
    attempts and backoff together. The connection is opened on first use inside the running event
    loop; ``await client.close()`` (or ``async with``) closes it.

    Args:
        url, protocol, **options: as for :class:`~fastpath_client._core.ClientCore`.
        max_in_flight: inference requests in flight at once (>= 1), 8 by default: with requests of 64
            texts that is half of FastPath's default queue (1024 texts), enough to keep both engine
            lanes busy with the next batches already queued. None: no bound (a load generator that
            sets its own concurrency).
        max_connections: HTTP connection pool size (aiohttp ``limit``).
        sleep: awaitable sleep, injectable for tests.

    Raises:
        InvalidInputError: ``max_in_flight`` is not None and below 1.
    """

    def __init__(self, url: str = "localhost:8000", protocol: str = "http", *, max_in_flight: int | None = 8,
                 max_connections: int = 256, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 **options: Any) -> None:
        super().__init__(url, protocol, **options)
        if max_in_flight is not None and (not isinstance(max_in_flight, int) or isinstance(max_in_flight, bool)
                                          or max_in_flight < 1):
            raise InvalidInputError(f"max_in_flight must be a whole number >= 1 (requests), or None; got {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        self._sleep = sleep
        self._max_connections = max_connections
        self._client: Any = None
        self._slots: asyncio.Semaphore | None = None

    def _triton(self) -> Any:
        if self._client is None:
            if self.protocol == "http":
                import tritonclient.http.aio as httpaio

                self._client = httpaio.InferenceServerClient(self.url, conn_limit=self._max_connections,
                                                             conn_timeout=None)
            else:
                import tritonclient.grpc.aio as grpcaio

                self._client = grpcaio.InferenceServerClient(self.url, channel_args=grpc_channel_args())
        return self._client

    async def _call(self, model: str | None, operation: Callable[[Any], Awaitable[T]],
                    timeout_s: float | None = None, *, retry: bool = True) -> T:
        """Await ``operation(triton_client)`` under the timeout, with error mapping and retries."""
        timeout = self._timeout(timeout_s)
        backoff = self._backoff(timeout)

        async def attempt() -> T:
            try:  # each attempt gets what is left of the call's timeout
                return await asyncio.wait_for(operation(self._triton()), backoff.remaining_s())
            except Exception as exc:
                raise self._error(exc, model, timeout) from exc

        if not retry:
            return await attempt()
        return await acall_with_retry(attempt, backoff, sleep=self._sleep, on_retry=self._retried)

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A place among the ``max_in_flight`` inference requests (held through retries and backoff, so
        a busy server sees fewer requests, not more); a no-op context without a bound."""
        if self.max_in_flight is None:
            return contextlib.nullcontext()
        if self._slots is None:  # made in the running loop, like the connection
            self._slots = asyncio.Semaphore(self.max_in_flight)
        return self._slots

    async def ready(self, model: str | None = None, *, timeout_s: float | None = None) -> bool:
        """Whether the server (and ``model``, when given) is ready; False when unreachable. Never raises."""
        try:
            return await self._ready(model, timeout_s)
        except FastPathClientError:
            return False

    async def _ready(self, model: str | None, timeout_s: float | None) -> bool:
        """:meth:`ready`, except that a :class:`~fastpath_client.errors.ProtocolMismatchError` is raised."""
        try:
            if model is None:
                return bool(await self._call(None, lambda c: c.is_server_ready(), timeout_s, retry=False))
            return bool(await self._call(model, lambda c: c.is_model_ready(model), timeout_s, retry=False))
        except ProtocolMismatchError:
            raise
        except FastPathClientError:
            return False

    async def wait_ready(self, timeout_s: float = 120.0, models: Sequence[str] = ()) -> None:
        """Wait until the server and ``models`` are ready; see :meth:`fastpath_client.Client.wait_ready`.

        Raises:
            RequestTimeoutError: not ready after ``timeout_s``, naming what was not ready (each model with
                its state from the repository index, or from the unrestricted API without the admin key).
            ProtocolMismatchError: the url answers the other protocol (raised at once: waiting cannot help).
            WrongPortError: the url answers HTTP but not as Triton's API (e.g. its metrics port).
        """
        deadline = self._clock() + timeout_s
        poll = 0
        while True:
            waiting = [m for m in ((None,) + tuple(models)) if not await self._ready(m, min(5.0, timeout_s))]
            if not waiting:
                if self.protocol == "http":  # raises WrongPortError where only readiness looked like Triton's
                    await self._call(None, lambda c: c.get_server_metadata(), 5.0, retry=False)
                return
            now = self._clock()
            if now >= deadline:
                raise RequestTimeoutError(await self._not_ready_message(waiting, timeout_s), url=self.url)
            await self._sleep(min(self.retry.delay_s(poll, 0.0), max(deadline - now, 0.0)))
            poll += 1

    async def _not_ready_message(self, waiting: list[str | None], timeout_s: float) -> str:
        if None in waiting and not await self.ready(timeout_s=2.0):
            return self._server_not_ready(timeout_s)
        states: dict[str, str] = {}
        refused = False
        for model in (m for m in waiting if m is not None):
            if not refused:
                try:
                    states[model] = index_state(await self._versions(model, 5.0, retry=False))
                    continue
                except FastPathClientError as error:  # 403 without the admin key; the index fails alone
                    refused = isinstance(error, PermissionDeniedError)
            states[model] = unrestricted_state(await self._metadata_error(model))
        return self._models_not_ready(states, timeout_s, refused)

    async def _metadata_error(self, model: str) -> FastPathClientError | None:
        """What ``get_model_metadata`` (unrestricted) answers for ``model``: None, or the error."""
        try:
            await self._call(model, lambda c: c.get_model_metadata(model), 5.0, retry=False)
        except FastPathClientError as error:
            return error
        return None

    async def model_config(self, model: str, *, refresh: bool = False, timeout_s: float | None = None) -> ModelSpec:
        """The model's inputs, outputs and max_batch_size (cached); ``timeout_s`` bounds the fetch like a request's."""
        if refresh or model not in self._specs:
            as_json = {} if self.protocol == "http" else {"as_json": True}
            self._specs[model] = model_spec(await self._call(model, lambda c: c.get_model_config(model, **as_json), timeout_s))
        return self._specs[model]

    async def versions(self, model: str) -> list[dict[str, str]]:
        """Versions of ``model`` in the repository index: dicts with name, version, state, reason.

        Raises:
            PermissionDeniedError: the repository index is restricted and the admin key missing or wrong.
        """
        return await self._versions(model, None, retry=True)

    async def _versions(self, model: str, timeout_s: float | None, *, retry: bool) -> list[dict[str, str]]:
        as_json = {} if self.protocol == "http" else {"as_json": True}
        return repository_versions(await self._call(model, lambda c: c.get_model_repository_index(
            headers=self._admin_headers, **as_json), timeout_s, retry=retry), model)

    async def statistics(self, model: str) -> dict[str, tuple[int, int]]:
        """Cumulative ``(count, ns)`` per phase of ``model`` from Triton's statistics API."""
        as_json = {} if self.protocol == "http" else {"as_json": True}
        stats = await self._call(model, lambda c: c.get_inference_statistics(model, **as_json))
        return model_statistics(stats, model)

    async def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
                    version: str = "", timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs``; see :meth:`fastpath_client.Client.infer`."""
        return await self._infer(model, inputs, outputs, version, timeout_s, retry=True)

    async def _infer(self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None, version: str,
                     timeout_s: float | None, *, retry: bool) -> dict[str, np.ndarray]:
        version = inference_version(version)
        request = self._prepare(model, inputs, outputs)
        async with self._slot():
            return await self._call(model, lambda c: self._infer_once(c, model, version, request, outputs), timeout_s,
                                    retry=retry)

    async def _infer_once(self, triton: Any, model: str, version: str, request: Any,
                          names: Sequence[str] | None) -> dict[str, np.ndarray]:
        async def send() -> dict[str, np.ndarray]:
            result = await triton.infer(model, request.inputs, model_version=version, outputs=request.outputs)
            return collect(result, model, names)

        if not request.deferred or self.shm_refused is not None:
            request.inline()
            return await send()
        for name in self._take_pending():
            await self._unregister(triton, name)
        arrays = [array for _, array in request.deferred]
        region, fresh = self._region_for(arrays)
        if fresh:
            try:
                await triton.register_system_shared_memory(region.name, region.key, region.byte_size)
            except Exception as exc:
                region.destroy()
                error = self._error(exc, model, None)
                if not self._shm_fallback(error):
                    raise
                request.inline()
                return await send()
            self.counters["shm_registrations"] += 1
        ok = False
        try:
            self._fill(region, request)
            outputs = await send()
            ok = True
            return outputs
        finally:
            await self._release(triton, self._finish_region(region, ok))

    async def _release(self, triton: Any, regions: list) -> None:
        for region in regions:
            await self._unregister(triton, region.name)
            region.destroy()

    async def _unregister(self, triton: Any, name: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(triton.unregister_system_shared_memory(name)), 5.0)
        except Exception as exc:
            self._unregister_failed(name, exc)

    async def _drain_unregister(self, drain_s: float) -> None:
        """Unregister regions the server still used, waiting up to ``drain_s`` for their requests."""
        deadline, poll = self._clock() + drain_s, 0
        while self._pending_unregister and self._client is not None:
            for name in self._take_pending():
                await self._unregister(self._client, name)
            if not self._pending_unregister or self._clock() >= deadline:
                break
            await self._sleep(self.retry.delay_s(poll, 0.0))
            poll += 1
        if self._pending_unregister:
            LOG.warning("shared-memory regions %s still registered at %s after %g s", self._pending_unregister,
                        self.url, drain_s)

    async def embed(self, texts: Iterable[str | bytes], *, model: str = EMBEDDING_MODEL,
                    timeout_s: float | None = None) -> np.ndarray:
        """Sentence embeddings, float32 [N, 384], rows in input order; chunks of ``max_batch_size`` texts
        go concurrently, as many at once as :func:`~fastpath_client.flow.fan_out` allows.

        Raises:
            InvalidInputError: as :meth:`fastpath_client.Client.embed`; a refused text is named by its
                index in ``texts``.
            FastPathClientError: the first chunk that failed after its retries (the others are cancelled).
        """
        texts = text_sequence(texts, name=TEXT_INPUT)
        spec = await self.model_config(model, timeout_s=timeout_s)
        batches = self._embed_batches(spec, texts)

        def chunk(offset: int, batch: np.ndarray) -> Callable[[], Awaitable[np.ndarray]]:
            async def send() -> np.ndarray:
                with items_from(offset, (TEXT_INPUT,)):
                    result = await self.infer(model, {TEXT_INPUT: batch}, outputs=[EMBEDDING_OUTPUT], timeout_s=timeout_s)
                return result[EMBEDDING_OUTPUT]

            return send

        limit = fan_out(spec, len(batches), max((len(b) for _, b in batches), default=0), self.max_in_flight)
        parts = await run_bounded([chunk(offset, batch) for offset, batch in batches], max(limit, 1))
        return self._embed_join(spec, parts, len(texts))

    async def detect_text(self, images: Sequence[Any], *, model: str = DETECTION_MODEL,
                          timeout_s: float | None = None) -> list[detection.Detection]:
        """Text boxes per image; see :meth:`fastpath_client.Client.detect_text`. Images go concurrently,
        bounded like :meth:`embed`'s chunks.

        Raises:
            InvalidInputError: as :meth:`fastpath_client.Client.detect_text`, naming the image's index.
        """
        spec = await self.model_config(model, timeout_s=timeout_s)
        io, requests = self._detection_plan(spec, images)

        def one(index: int, inputs: dict) -> Callable[[], Awaitable[detection.Detection]]:
            async def send() -> detection.Detection:
                with items_from(index, self._image_inputs(io)):
                    result = await self.infer(model, inputs, outputs=io.outputs, timeout_s=timeout_s)
                return detection.parse_detection(io, model, result)

            return send

        limit = fan_out(spec, len(requests), 1, self.max_in_flight)
        return await run_bounded([one(index, inputs) for index, inputs in enumerate(requests)], max(limit, 1))

    async def swap(self, model: str, version: int, *, timeout_s: float = 180.0) -> dict[str, Any]:
        """Make ``version`` of ``model`` active, live; see :meth:`fastpath_client.Client.swap`."""
        return await self._admin("swap", model, timeout_s, version=model_version(version))

    async def rollback(self, model: str, *, timeout_s: float = 180.0) -> dict[str, Any]:
        """Go back to the version active before the last swap; see :meth:`fastpath_client.Client.rollback`."""
        return await self._admin("rollback", model, timeout_s)

    async def status(self, model: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Active version(s) of ``model``, each instance's state, liveness and reloads; see :meth:`fastpath_client.Client.status`."""
        return await self._admin("status", model, timeout_s)

    async def _admin(self, command: str, model: str, timeout_s: float | None, **fields: Any) -> dict[str, Any]:
        try:
            outputs = await self._infer(ADMIN_MODEL, self._admin_request(command, model, **fields), ["RESPONSE"], "",
                                        timeout_s, retry=command not in MUTATING_COMMANDS)
        except InvalidInputError as error:
            raise self._admin_error(error) from error
        return self._admin_reply(command, outputs)

    async def close(self, *, drain_s: float = 30.0) -> None:
        """Unregister leftover shared-memory regions (see :meth:`fastpath_client.Client.close`), then
        close the connection (idempotent)."""
        if self._client is not None:
            await self._release(self._client, self._pool.drain())
        await self._drain_unregister(drain_s)
        client, self._client, self._slots = self._client, None, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
