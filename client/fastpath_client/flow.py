"""How many requests :class:`~fastpath_client.AsyncClient` has in flight, and fan-outs that end with their call.

A server queues what it cannot run yet, up to a limit (FastPath: ``max_queue_texts``, 1024 texts by
default; Triton: ``default_queue_policy.max_queue_size``) and refuses the rest as busy ("Exceeds
maximum queue size"). A client that sends every request of a large call at once only fills that queue
and turns the rest into retries, so the async client keeps a bounded number in flight, as the
blocking client (one request at a time) does by construction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fastpath_client.tensors import ModelSpec

T = TypeVar("T")


def fan_out(spec: ModelSpec, requests: int, items_per_request: int, max_in_flight: int | None) -> int:
    """Requests one call keeps in flight: at most ``max_in_flight`` and what the server's queue holds.

    Args:
        spec: the model's config; its ``max_queue_items`` (items the server queues, FastPath's
            ``max_queue_texts``) and ``max_queue_requests`` (Triton's ``max_queue_size``) when it has them.
        requests: requests the call sends.
        items_per_request: items (texts, images) in its largest request.
        max_in_flight: the client's bound; None: no bound of its own.

    Returns:
        An int >= 1 (0 when ``requests`` is 0): a call alone never overflows the server's queue.
    """
    limit = requests
    if max_in_flight is not None:
        limit = min(limit, max_in_flight)
    if spec.max_queue_items:
        limit = min(limit, max(1, spec.max_queue_items // max(items_per_request, 1)))
    if spec.max_queue_requests:
        limit = min(limit, spec.max_queue_requests)
    return max(limit, 1) if requests else 0


async def run_bounded(jobs: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Await ``jobs`` with at most ``limit`` running at once, started in order; results in job order.

    The first job that raises ends the call: the jobs still running are cancelled and awaited, the
    ones not started never start, and its exception is raised (the lowest-indexed one when several
    failed together). Cancelling the caller cancels every job the same way. No job outlives the call,
    so a client closed after it (``async with``) closes with nothing in flight.

    Args:
        jobs: coroutine factories, one per request.
        limit: concurrent jobs at most (>= 1).

    Raises:
        ValueError: ``limit`` < 1.
        Exception: the first exception a job raised.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1 concurrent jobs, got {limit}")
    results: list[T] = [None] * len(jobs)  # type: ignore[list-item]
    failures: dict[int, BaseException] = {}
    order = iter(range(len(jobs)))

    async def worker() -> None:
        for index in order:  # one iterator shared by the workers: each index is taken once
            try:
                results[index] = await jobs[index]()
            except Exception as exc:
                failures[index] = exc
                raise

    workers = [asyncio.ensure_future(worker()) for _ in range(min(limit, len(jobs)))]
    try:
        if workers:
            await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    if failures:
        raise failures[min(failures)]
    return results
