"""Bounded fan-out of AsyncClient calls: concurrency bound, result order, and that no job outlives its call."""

from __future__ import annotations

import asyncio

import pytest

from fastpath_client.flow import fan_out, run_bounded
from fastpath_client.tensors import ModelSpec


def _spec(max_queue_items=None, max_queue_requests=None):
    return ModelSpec(name="m", max_batch_size=64, inputs=(), outputs=(), max_queue_items=max_queue_items,
                     max_queue_requests=max_queue_requests)


class Gate:
    """Jobs that block until released, recording how many run at once and which started."""

    def __init__(self, count):
        self.release = [asyncio.Event() for _ in range(count)]
        self.started: list[int] = []
        self.running = 0
        self.most = 0
        self.cancelled: list[int] = []

    def job(self, index, fail=False):
        async def run():
            self.started.append(index)
            self.running += 1
            self.most = max(self.most, self.running)
            try:
                await self.release[index].wait()
                if fail:
                    raise RuntimeError(f"job {index} failed")
                return index * 10
            except asyncio.CancelledError:
                self.cancelled.append(index)
                raise
            finally:
                self.running -= 1

        return run


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0)


def test_at_most_limit_jobs_run_at_once_and_results_keep_job_order():
    """With 10 jobs and limit 3, never more than 3 run, they start in order, and result i is job i's."""

    async def scenario():
        gate = Gate(10)
        call = asyncio.ensure_future(run_bounded([gate.job(i) for i in range(10)], 3))
        await _until(lambda: len(gate.started) == 3)
        for index in (2, 0, 1, 5, 3, 4, 9, 8, 7, 6):  # finish out of order
            gate.release[index].set()
            await asyncio.sleep(0)
        results = await call
        return gate, results

    gate, results = asyncio.run(scenario())
    assert results == [i * 10 for i in range(10)]
    assert gate.most == 3 and sorted(gate.started) == list(range(10)) and gate.started[:3] == [0, 1, 2]


def test_first_failure_cancels_running_jobs_and_starts_no_more():
    """Job 1 fails while jobs 0 and 2 run: both are cancelled and awaited, jobs 3-5 never start, job 1's error is raised."""

    async def scenario():
        gate = Gate(6)
        jobs = [gate.job(i, fail=(i == 1)) for i in range(6)]
        call = asyncio.ensure_future(run_bounded(jobs, 3))
        await _until(lambda: len(gate.started) == 3)
        gate.release[1].set()
        with pytest.raises(RuntimeError, match="job 1 failed"):
            await call
        return gate

    gate = asyncio.run(scenario())
    assert sorted(gate.cancelled) == [0, 2] and sorted(gate.started) == [0, 1, 2] and gate.running == 0


def test_cancelling_the_caller_cancels_every_job():
    """A cancelled call leaves nothing running: its running jobs see CancelledError before it returns."""

    async def scenario():
        gate = Gate(4)
        call = asyncio.ensure_future(run_bounded([gate.job(i) for i in range(4)], 2))
        await _until(lambda: len(gate.started) == 2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return gate

    gate = asyncio.run(scenario())
    assert sorted(gate.cancelled) == [0, 1] and gate.running == 0 and len(gate.started) == 2


def test_no_jobs_and_a_bad_limit():
    assert asyncio.run(run_bounded([], 4)) == []
    with pytest.raises(ValueError, match="limit must be >= 1 concurrent jobs, got 0"):
        asyncio.run(run_bounded([], 0))


@pytest.mark.parametrize(
    ("spec", "requests", "items", "max_in_flight", "expected"),
    [
        (_spec(), 157, 64, 8, 8),  # the client's bound
        (_spec(), 3, 64, 8, 3),  # fewer requests than the bound
        (_spec(), 157, 64, None, 157),  # no bound, no queue limit known
        (_spec(max_queue_items=1024), 157, 64, None, 16),  # FastPath's queue: 1024 texts / 64 per request
        (_spec(max_queue_items=128), 157, 64, 8, 2),  # a small queue wins over the client's bound
        (_spec(max_queue_items=32), 157, 64, 8, 1),  # a queue smaller than one request: one at a time
        (_spec(max_queue_requests=4), 157, 64, 8, 4),  # Triton's max_queue_size counts requests
        (_spec(max_queue_items=1024), 0, 0, 8, 0),
    ],
)
def test_fan_out_never_exceeds_the_bound_or_the_servers_queue(spec, requests, items, max_in_flight, expected):
    """requests in flight = min(requests, max_in_flight, queue items // items per request, queue requests), >= 1."""
    assert fan_out(spec, requests, items, max_in_flight) == expected


class CountingTransport:
    """In place of tritonclient's aio client: each infer waits until released and records how many
    were in flight at once."""

    def __init__(self):
        self.in_flight = self.most = self.calls = 0
        self.release = asyncio.Event()

    async def infer(self, model, inputs, model_version="", outputs=None):
        self.calls += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1
        return self

    def as_numpy(self, name):
        import numpy as np

        return np.zeros((1, 1), np.float32)

    async def close(self):
        pass


def test_async_client_bounds_requests_in_flight_across_concurrent_calls():
    """Ten concurrent infer() calls on one AsyncClient(max_in_flight=3): never more than 3 reach the
    transport at once, and all ten complete once released."""
    from fastpath_client import AsyncClient

    async def scenario():
        transport = CountingTransport()
        client = AsyncClient("127.0.0.1:1", max_in_flight=3, shared_memory="never")
        client._triton = lambda: transport
        calls = [asyncio.ensure_future(client.infer("m", {"X": [[1.0]]}, outputs=["Y"])) for _ in range(10)]
        await _until(lambda: transport.in_flight == 3)
        for _ in range(5):
            await asyncio.sleep(0)
        assert transport.calls == 3
        transport.release.set()
        await asyncio.gather(*calls)
        return transport

    transport = asyncio.run(scenario())
    assert transport.most == 3 and transport.calls == 10


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "8"])
def test_async_client_refuses_a_bad_max_in_flight(value):
    from fastpath_client import AsyncClient, InvalidInputError

    with pytest.raises(InvalidInputError, match=f"max_in_flight must be a whole number >= 1 \\(requests\\), or None; got {value!r}"):
        AsyncClient("127.0.0.1:8000", max_in_flight=value)
