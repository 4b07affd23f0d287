"""AsyncClient with large inputs against a real tritonserver: bounded requests in flight, back-off on a
full queue, retries while a crashed model instance is reloaded, and sessions closed on every path."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
import warnings

import numpy as np
import pytest

from fastpath_client import (
    NO_RETRY,
    AsyncClient,
    Client,
    FastPathClientError,
    InvalidInputError,
    ModelRestartingError,
    ServerBusyError,
)
from tests.conftest import MODEL_REPOSITORY, start_server
from tests.e2e.swap_support import link_version

pytestmark = pytest.mark.e2e
PROTOCOLS = ["http", "grpc"]
MODEL = "text_embedding"
ROW_ATOL = 1e-5  # a text's embedding does not depend on its batch neighbours beyond float rounding


def _url(server, protocol):
    return server.http_url if protocol == "http" else server.grpc_url


def _texts(count):
    return [f"text {i}" for i in range(count)]


def run_clean(coroutine_factory, caplog):
    """``asyncio.run(coroutine_factory())`` with every warning recorded and a garbage collection after it,
    so that an unclosed aiohttp session or connector (a ResourceWarning, or asyncio's "Unclosed ..."
    log line) is seen; returns (result or exception, warning texts)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    caplog.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            outcome = asyncio.run(coroutine_factory())
        except Exception as exc:  # returned for the test to check
            outcome = exc
        gc.collect()
    texts = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning) or "nclosed" in str(w.message)]
    texts += [r.getMessage() for r in caplog.records if "nclosed" in r.getMessage()]
    return outcome, texts


@pytest.fixture(scope="module")
def sync_10k(triton_server):
    """The blocking client's embeddings of 10,000 short texts (one request of 64 at a time)."""
    with Client(triton_server.http_url) as client:
        return client.embed(_texts(10_000))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_10k_texts_come_back_in_order_equal_to_the_sync_client(triton_server, sync_10k, protocol, caplog):
    """10,000 texts (157 requests): every row equals the sync client's row for the same index, no request
    was refused (a lone client never overflows the server's queue: retries == 0), and no session is left open."""
    url = _url(triton_server, protocol)

    async def embed():
        async with AsyncClient(url, protocol) as client:
            spec = await client.model_config(MODEL)
            return await client.embed(_texts(10_000)), client.counters["retries"], spec

    outcome, unclosed = run_clean(embed, caplog)
    assert not isinstance(outcome, Exception), outcome
    got, retries, spec = outcome
    assert spec.max_queue_items == 1024  # the config's max_queue_texts, over HTTP and gRPC alike
    assert got.shape == (10_000, 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, sync_10k, atol=ROW_ATOL)
    assert retries == 0 and unclosed == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_100k_texts_finish_with_every_row_in_order(triton_server, protocol, caplog):
    """100,000 texts (1,563 requests), 5,000 distinct ones in a seeded shuffled order: row i is the sync
    client's embedding of texts[i]; the call keeps the server's pace (at least 150 texts/s on 2 shared cores,
    where the engine's own floor is ~600 texts/s unloaded); no session is left open."""
    distinct = _texts(5_000)
    order = np.random.default_rng(7).permutation(np.tile(np.arange(5_000), 20))
    texts = [distinct[i] for i in order]
    with Client(triton_server.http_url) as client:
        reference = client.embed(distinct)
    url = _url(triton_server, protocol)

    async def embed():
        async with AsyncClient(url, protocol) as client:
            started = time.monotonic()
            rows = await client.embed(texts)
            return rows, time.monotonic() - started

    outcome, unclosed = run_clean(embed, caplog)
    assert not isinstance(outcome, Exception), outcome
    got, seconds = outcome
    assert got.shape == (100_000, 384)
    np.testing.assert_allclose(got, reference[order], atol=ROW_ATOL)
    assert len(texts) / seconds >= 150, f"{len(texts) / seconds:.0f} texts/s"
    assert unclosed == []
    print(f"{protocol}: 100,000 texts in {seconds:.1f} s ({len(texts) / seconds:.0f} texts/s)")


def small_queue_repository(root):
    """A repository whose text_embedding queues at most 64 texts (max_queue_texts, the smallest legal value)."""
    model_dir = root / "repo" / MODEL
    model_dir.mkdir(parents=True)
    config = (MODEL_REPOSITORY / MODEL / "config.pbtxt").read_text()
    line = 'parameters { key: "max_queue_texts" value: { string_value: "1024" } }'
    assert line in config
    (model_dir / "config.pbtxt").write_text(config.replace(line, line.replace("1024", "64")))
    link_version(MODEL_REPOSITORY / MODEL / "1", model_dir / "1")
    return root / "repo"


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_queue")
    server = start_server(root, models=(MODEL,), repository=small_queue_repository(root))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_clients_sharing_a_full_queue_back_off_and_all_succeed(small_queue_server, protocol, caplog):
    """Six clients embed 640 texts each into a queue of 64 texts: a lone client reads the limit from the
    config and sends one request at a time (no refusal), but together they overflow it. Every 503 /
    UNAVAILABLE "Exceeds maximum queue size" is retried after a capped, jittered exponential delay, and
    every client gets all its rows, in order, equal to the sync client's."""
    url = _url(small_queue_server, protocol)
    batches = [_texts(640 * (k + 1))[640 * k:] for k in range(6)]
    with Client(small_queue_server.http_url) as client:
        expected = [client.embed(texts) for texts in batches]
    seen = []

    async def embed_all():
        clients = [AsyncClient(url, protocol, on_retry=lambda n, e, d: seen.append((e, d))) for _ in batches]
        try:
            alone = await clients[0].embed(batches[0])
            lone_retries = clients[0].counters["retries"]
            rows = await asyncio.gather(*(c.embed(texts) for c, texts in zip(clients, batches)))
            return alone, lone_retries, rows
        finally:
            for client in clients:
                await client.close()

    outcome, unclosed = run_clean(embed_all, caplog)
    assert not isinstance(outcome, Exception), outcome
    alone, lone_retries, rows = outcome
    np.testing.assert_allclose(alone, expected[0], atol=ROW_ATOL)
    assert lone_retries == 0
    for got, want in zip(rows, expected):
        np.testing.assert_allclose(got, want, atol=ROW_ATOL)
    assert seen, "six clients on a 64-text queue were never refused"
    assert all(isinstance(error, ServerBusyError) for error, _ in seen)
    assert all(0 < delay <= 2.0 for _, delay in seen)  # RetryPolicy's cap: max_backoff_s
    assert unclosed == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sessions_close_after_an_error_a_cancellation_and_an_explicit_close(triton_server, protocol, caplog):
    """A bad text in the middle of 2,000 (the other requests are cancelled), an embed cancelled by a 0.5 s
    wait_for, and an explicit close() without ``async with``: each leaves no session open, and the
    server answers the next call."""
    url = _url(triton_server, protocol)
    texts = _texts(2_000)

    async def error_path():
        async with AsyncClient(url, protocol) as client:
            return await client.embed(texts[:1_000] + [b"\xff\xfe"] + texts[1_000:])

    outcome, unclosed = run_clean(error_path, caplog)
    assert isinstance(outcome, InvalidInputError) and "TEXT[1000] is not valid UTF-8" in str(outcome)
    assert unclosed == []

    async def cancelled_path():
        async with AsyncClient(url, protocol) as client:
            return await asyncio.wait_for(client.embed(_texts(20_000)), 0.5)

    outcome, unclosed = run_clean(cancelled_path, caplog)
    assert isinstance(outcome, TimeoutError) and unclosed == []

    async def explicit_close():
        client = AsyncClient(url, protocol)
        try:
            return await client.embed(texts[:100])
        finally:
            await client.close()

    outcome, unclosed = run_clean(explicit_close, caplog)
    assert not isinstance(outcome, Exception) and outcome.shape == (100, 384) and unclosed == []


KEY = "test-client-restart-key"


# Triton 2.51 itself aborted in ~2 of 27 stub kills under load (boost::interprocess::lock_exception,
# docs/known-issues.md): no client can be retried through a server that is gone
UPSTREAM_ABORT = "lock_exception"
# A clean-clone CI run saw two such aborts in a row on a loaded 2-core machine; 0 of 8 aborted on an idle one.
# Three fresh servers bring a 1-in-3 abort rate down to a ~4 % chance of never seeing a run through.
KILL_RUNS = 3
# The kill waits this long after the last embed: longer than the metrics flush interval (metrics_interval_ms,
# 500 ms), so that the stub is idle, not inside a round trip to the server, when it dies.
SETTLE_S = 1.5


def _kill_stub_and_embed(root, protocol, caplog) -> dict:
    """Embed 300 texts, kill the model's stub, wait for Triton's "not healthy", start the supervisor and
    embed the same texts through the reload; what happened, and how tritonserver ended."""
    from fastpath.cli.serve import stub_supervisor
    from fastpath.server.process import group_members
    from fastpath.server.stubs import list_stubs

    root.mkdir(parents=True)
    server = start_server(root, models=(MODEL,), admin_key=KEY)
    supervisor = stub_supervisor(server)
    seen = []
    try:
        texts = _texts(300)
        with Client(server.http_url) as client:
            before = client.embed(texts)
        supervisor.check()  # its first look: the stub is alive (a death is a stub it saw that is gone)
        time.sleep(SETTLE_S)
        (stub,) = [s for s in list_stubs(group_members(server.pid)) if s.model == MODEL]
        os.kill(stub.pid, signal.SIGKILL)
        with Client(server.http_url, retry=NO_RETRY) as client:  # until Triton answers "not healthy"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    client.infer(MODEL, {"TEXT": [[b"probe"]]}, timeout_s=2)
                except ModelRestartingError:
                    break
                except FastPathClientError:  # a request inside the dying stub is never answered
                    continue
        supervisor.start()
        url = _url(server, protocol)

        async def embed():
            async with AsyncClient(url, protocol, timeout_s=120, on_retry=lambda n, e, d: seen.append(e)) as client:
                return await client.embed(texts)

        outcome, unclosed = run_clean(embed, caplog)
    finally:
        supervisor.stop()
        exit_code = server.stop()
    log = (root / "tritonserver.log").read_text(errors="replace")
    aborted = exit_code == -signal.SIGABRT and UPSTREAM_ABORT in log
    return {"before": before, "outcome": outcome, "unclosed": unclosed, "seen": seen,
            "reloaded": supervisor.reloaded, "upstream_abort": aborted}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inference_is_retried_while_a_crashed_instance_is_reloaded(tmp_path, protocol, caplog):
    """After the model's stub is killed, Triton answers INTERNAL "Stub process ... is not healthy" until
    the stub supervisor (what ``fastpath serve`` runs) unloads the model, then "no available versions"
    until it has loaded it again: an embed sent meanwhile is retried through both (ModelRestartingError,
    ModelNotReadyError: neither counts against max_attempts) and returns the rows the model gave before
    the crash. A run in which tritonserver itself aborts with Triton 2.51's documented lock_exception is
    run again on a fresh server, up to KILL_RUNS runs (that abort is upstream's, not the client's to survive)."""
    for attempt in range(KILL_RUNS):
        run = _kill_stub_and_embed(tmp_path / f"run{attempt}", protocol, caplog)
        if not run["upstream_abort"]:
            break
    outcome = run["outcome"]
    assert not isinstance(outcome, Exception), outcome
    np.testing.assert_allclose(outcome, run["before"], atol=ROW_ATOL)
    assert any(isinstance(error, ModelRestartingError) for error in run["seen"]) and run["unclosed"] == []
    assert run["reloaded"] == [MODEL]

