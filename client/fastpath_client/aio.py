"""The asyncio client: :class:`AsyncClient` (``tritonclient.http.aio`` / ``tritonclient.grpc.aio``)."""

from __future__ import annotations

import asyncio
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
from fastpath_client.errors import (
    FastPathClientError,
    InvalidInputError,
    PermissionDeniedError,
    ProtocolMismatchError,
    RequestTimeoutError,
)
from fastpath_client.retry import acall_with_retry
from fastpath_client.tensors import ModelSpec, model_spec, model_statistics, repository_versions, text_sequence

T = TypeVar("T")


class AsyncClient(ClientCore):
    """The awaitable twin of :class:`~fastpath_client.Client`: same methods, same errors, same retries.

    Each attempt is bounded by ``asyncio.wait_for(..., timeout_s)``. Calls may run concurrently on one
    instance (``asyncio.gather``); ``embed`` sends its chunks and ``detect_text`` its images concurrently.
    The connection is opened on first use inside the running event loop; ``await client.close()`` (or
    ``async with``) closes it.

    Args:
        url, protocol, **options: as for :class:`~fastpath_client._core.ClientCore`.
        max_connections: HTTP connection pool size (aiohttp ``limit``).
        sleep: awaitable sleep, injectable for tests.
    """

    def __init__(self, url: str = "localhost:8000", protocol: str = "http", *, max_connections: int = 256,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, **options: Any) -> None:
        super().__init__(url, protocol, **options)
        self._sleep = sleep
        self._max_connections = max_connections
        self._client: Any = None

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

        async def attempt() -> T:
            try:
                return await asyncio.wait_for(operation(self._triton()), timeout)
            except Exception as exc:
                raise self._error(exc, model, timeout) from exc

        if not retry:
            return await attempt()
        return await acall_with_retry(attempt, self._backoff(), sleep=self._sleep, on_retry=self._retried)

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
        """
        deadline = self._clock() + timeout_s
        poll = 0
        while True:
            waiting = [m for m in ((None,) + tuple(models)) if not await self._ready(m, min(5.0, timeout_s))]
            if not waiting:
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

    async def model_config(self, model: str, *, refresh: bool = False) -> ModelSpec:
        """The model's inputs, outputs and max_batch_size (cached)."""
        if refresh or model not in self._specs:
            as_json = {} if self.protocol == "http" else {"as_json": True}
            self._specs[model] = model_spec(await self._call(model, lambda c: c.get_model_config(model, **as_json)))
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
        request = self._prepare(model, inputs, outputs)
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
        """Sentence embeddings, float32 [N, 384]; chunks of ``max_batch_size`` go concurrently.

        Raises:
            InvalidInputError: as :meth:`fastpath_client.Client.embed`; a refused text is named by its
                index in ``texts``.
        """
        texts = text_sequence(texts, name=TEXT_INPUT)
        spec = await self.model_config(model)

        async def chunk(offset: int, batch: np.ndarray) -> np.ndarray:
            with items_from(offset, (TEXT_INPUT,)):
                result = await self.infer(model, {TEXT_INPUT: batch}, outputs=[EMBEDDING_OUTPUT], timeout_s=timeout_s)
            return result[EMBEDDING_OUTPUT]

        parts = await asyncio.gather(*(chunk(offset, batch) for offset, batch in self._embed_batches(spec, texts)))
        return self._embed_join(spec, list(parts), len(texts))

    async def detect_text(self, images: Sequence[Any], *, model: str = DETECTION_MODEL,
                          timeout_s: float | None = None) -> list[detection.Detection]:
        """Text boxes per image; see :meth:`fastpath_client.Client.detect_text`. Images go concurrently.

        Raises:
            InvalidInputError: as :meth:`fastpath_client.Client.detect_text`, naming the image's index.
        """
        io, requests = self._detection_plan(await self.model_config(model), images)

        async def one(index: int, inputs: dict) -> detection.Detection:
            with items_from(index, self._image_inputs(io)):
                result = await self.infer(model, inputs, outputs=io.outputs, timeout_s=timeout_s)
            return detection.parse_detection(io, model, result)

        return list(await asyncio.gather(*(one(index, inputs) for index, inputs in enumerate(requests))))

    async def swap(self, model: str, version: int, *, timeout_s: float = 180.0) -> dict[str, Any]:
        """Make ``version`` of ``model`` active, live; see :meth:`fastpath_client.Client.swap`."""
        return await self._admin("swap", model, timeout_s, version=int(version))

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
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
