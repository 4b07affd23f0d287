"""FastPath's scheduler under a real tritonserver: batch-independent results, queue-full and
timeout rejections as UNAVAILABLE, custom metrics on the metrics port, and drain on unload."""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import MODEL_REPOSITORY, start_server
from tests.e2e.callbacks import Callbacks

pytestmark = pytest.mark.e2e
MODEL = "text_embedding"


def _inputs(module, texts):
    data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    tensor = module.InferInput("TEXT", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return [tensor]


def _embed(server, texts, **kwargs):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    return client.infer(MODEL, _inputs(grpcclient, texts), **kwargs).as_numpy("EMBEDDING")


METRICS_SETTLE_S = 1.0  # FastPath publishes its metrics every metrics_interval_ms (500 ms by default)


def _metrics(server) -> str:
    """The /metrics text once FastPath's metrics flusher has published what came before this call."""
    time.sleep(METRICS_SETTLE_S)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.options.metrics_port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def _metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_each_response_equals_the_same_text_sent_alone(triton_server, sentences):
    """A text's embedding does not depend on its batch neighbours: mixed lengths batched together by the
    scheduler give the row each text gets alone."""
    long_text = " ".join(["inference"] * 360)
    texts = ["hello world", "", long_text] + sentences[:: max(1, len(sentences) // 45)][:45]
    alone = np.stack([_embed(triton_server, [text])[0] for text in texts])
    with concurrent.futures.ThreadPoolExecutor(16) as pool:  # concurrent single-text requests, shuffled
        order = np.random.default_rng(0).permutation(len(texts))
        rows = dict(zip(order, pool.map(lambda i: _embed(triton_server, [texts[i]])[0], order)))
        groups = [list(range(k, len(texts), 6)) for k in range(6)]  # and multi-text requests of mixed lengths
        grouped = list(pool.map(lambda g: _embed(triton_server, [texts[i] for i in g]), groups))
    together = np.stack([rows[i] for i in range(len(texts))])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    for group, embeddings in zip(groups, grouped):
        np.testing.assert_allclose(embeddings, alone[group], atol=1e-5)
    cosine = (together * alone).sum(axis=1) / (np.linalg.norm(together, axis=1) * np.linalg.norm(alone, axis=1))
    assert cosine.min() >= 0.9999


def test_a_request_past_its_timeout_gets_unavailable(triton_server):
    with pytest.raises(InferenceServerException) as info:
        _embed(triton_server, ["too late"], timeout=1)  # Triton request timeout: 1 microsecond
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "Request timeout expired" in info.value.message()
    assert _embed(triton_server, ["on time"], timeout=60_000_000).shape == (1, 384)


def test_scheduler_metrics_are_published(triton_server, sentences):
    """The session's server has served other tests' load, so the engine-time counter is checked by its increase."""
    labels = {"model": MODEL, "version": "1"}
    executed_before = _metric_sum(_metrics(triton_server), "fastpath_text_execution_seconds_total", **labels)
    _embed(triton_server, sentences[:20])
    text = _metrics(triton_server)
    assert _metric_sum(text, "fastpath_batch_size_count", **labels) >= 1
    assert _metric_sum(text, "fastpath_queue_delay_seconds_count", **labels) == _metric_sum(text, "fastpath_batch_size_count", **labels)
    assert _metric_sum(text, "fastpath_batch_size_sum", **labels) >= 20  # every text was dispatched
    assert _metric_sum(text, "fastpath_queue_duration_seconds_total", **labels) > 0
    # seconds, not microseconds: 20 texts' summed engine time is well under a minute
    assert 0 < _metric_sum(text, "fastpath_text_execution_seconds_total", **labels) - executed_before < 60
    assert _metric_sum(text, "fastpath_batch_padding_ratio_count", **labels) >= 1
    real = _metric_sum(text, "fastpath_real_tokens_total", **labels)
    assert real > 0 and _metric_sum(text, "fastpath_padded_tokens_total", **labels) >= real
    assert re.search(r'fastpath_batch_execution_seconds_bucket\{[^}]*batch_size="\d+"[^}]*seq_length="\d+"', text)
    assert "# TYPE fastpath_queue_duration_seconds_total counter" in text
    assert re.search(r'fastpath_text_execution_seconds_total\{model="text_embedding",path="(queued|inline)",pid="\d+",version="1"\}', text)
    assert "# TYPE fastpath_batch_size histogram" in text
    # every series names the stub that publishes it (pid), so two stubs never share one (triton-inference-server/server#8663)
    assert re.search(r'fastpath_rejected_texts_total\{model="text_embedding",pid="\d+",reason="timeout",version="1"\}', text)
    assert re.search(r'fastpath_pool_leases_total\{allocator="[^"]+",model="text_embedding",pid="\d+",pool="staging"\}', text)
    # every batch was staged in the host staging pool, and every lease came back
    staging = {"model": MODEL, "pool": "staging"}
    assert _metric_sum(text, "fastpath_pool_leases_total", **staging) >= 1
    assert _metric_sum(text, "fastpath_pool_outstanding_leases", **staging) == 0
    assert _metric_sum(text, "fastpath_pool_capacity_bytes", **staging) > 0


def _variant_server(tmp_path_factory, label, edit):
    """Fixture body: a server whose text_embedding config is the shipped one passed through ``edit``."""
    root = tmp_path_factory.mktemp(label)
    version = root / "repository" / MODEL / "1"
    version.mkdir(parents=True)
    (version.parent / "config.pbtxt").write_text(edit((MODEL_REPOSITORY / MODEL / "config.pbtxt").read_text()))
    for name in ("model.py", "model.onnx", "tokenizer.json", "manifest.json", "golden.npz"):
        (version / name).symlink_to(MODEL_REPOSITORY / MODEL / "1" / name)
    server = start_server(root, models=(MODEL,), repository=root / "repository")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root / "repository", ignore_errors=True)


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    """text_embedding with a 4-text queue and 4-row batches, so a burst overflows it."""
    def edit(config):
        config = re.sub(r'(key: "batch_buckets" value: \{ string_value: )"[^"]*"', r'\1"1,2,4"', config)
        return re.sub(r'(key: "max_queue_texts" value: \{ string_value: )"[^"]*"', r'\1"4"', config)

    yield from _variant_server(tmp_path_factory, "small_queue", edit)


def _burst(server, count, texts_per_request, protocol="grpc"):
    """``count`` concurrent requests; returns [(embedding or None, error or None)]."""
    module = grpcclient if protocol == "grpc" else httpclient
    text = " ".join(["scheduling"] * 120)

    def send(_):
        client = (grpcclient.InferenceServerClient(server.grpc_url) if protocol == "grpc"
                  else httpclient.InferenceServerClient(server.http_url, network_timeout=120))
        try:
            return client.infer(MODEL, _inputs(module, [text] * texts_per_request)).as_numpy("EMBEDDING"), None
        except InferenceServerException as exc:
            return None, exc

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(send, range(count)))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_queue_full_is_rejected_as_retryable_unavailable(small_queue_server, protocol):
    results = _burst(small_queue_server, 24, 2, protocol)
    errors = [error for _, error in results if error is not None]
    assert errors, "a 48-text burst into a 4-text queue must overflow it"
    expected = "StatusCode.UNAVAILABLE" if protocol == "grpc" else "503"
    assert {error.status() for error in errors} == {expected}
    assert all("Exceeds maximum queue size" in error.message() and "max_queue_texts=4" in error.message() for error in errors)
    good = [embedding for embedding, error in results if error is None]
    assert good and all(e.shape == (2, 384) and np.isfinite(e).all() for e in good)
    assert small_queue_server.is_ready(models=[MODEL])
    assert _metric_sum(_metrics(small_queue_server), "fastpath_rejected_texts_total", reason="queue_full") >= 2 * len(errors)


@pytest.fixture(scope="module")
def queue64_server(tmp_path_factory):
    """text_embedding with a 64-text queue (the shipped batch buckets and Triton batcher)."""
    yield from _variant_server(tmp_path_factory, "queue64", lambda config: re.sub(
        r'(key: "max_queue_texts" value: \{ string_value: )"[^"]*"', r'\1"64"', config))


def test_a_burst_of_large_requests_reaches_the_bounded_queue(queue64_server):
    """Requests of more than half of max_batch_size texts cannot share a Triton call, so a backlog of them
    looks like lone requests; they must not run inline (waiting in Triton's unbounded queue) but go to
    FastPath's bounded queue and overflow it with retryable UNAVAILABLE."""
    results = _burst(queue64_server, 16, 40)
    errors = [error for _, error in results if error is not None]
    assert errors, "16 requests of 40 texts into a 64-text queue must overflow it"
    assert {error.status() for error in errors} == {"StatusCode.UNAVAILABLE"}
    assert all("Exceeds maximum queue size" in error.message() for error in errors)
    good = [embedding for embedding, error in results if error is None]
    assert good and all(e.shape == (40, 384) and np.isfinite(e).all() for e in good)
    assert queue64_server.is_ready(models=[MODEL])


def test_unload_drains_every_accepted_request(small_queue_server):
    """Requests in flight at unload each get exactly one answer, none hangs; later ones get NOT_FOUND.

    Measured here: Triton 2.51 waits for in-flight requests (responses still owed through response
    senders) before it calls finalize, so they all succeed; finalize's own drain of queued texts is
    covered by tests/unit/scheduling/test_runner.py."""
    import threading

    text = " ".join(["draining"] * 100)
    done = threading.Condition()
    outcomes: list[tuple[str, str]] = []
    stop = threading.Event()

    def client_loop():
        client = grpcclient.InferenceServerClient(small_queue_server.grpc_url)
        while not stop.is_set():
            try:
                embedding = client.infer(MODEL, _inputs(grpcclient, [text]), client_timeout=120).as_numpy("EMBEDDING")
                outcome = ("ok", "") if embedding.shape == (1, 384) and np.isfinite(embedding).all() else ("bad", "")
            except InferenceServerException as exc:
                outcome = (exc.status(), exc.message())
            with done:
                outcomes.append(outcome)
                done.notify_all()
            if outcome[0] != "ok" and "Exceeds maximum queue size" not in outcome[1]:
                return  # the model is gone (or answered something unexpected): stop this client

    threads = [threading.Thread(target=client_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    with done:
        assert done.wait_for(lambda: sum(o == ("ok", "") for o in outcomes) >= 6, timeout=120)
    admin = httpclient.InferenceServerClient(small_queue_server.http_url)
    admin.unload_model(MODEL)
    for thread in threads:
        thread.join(150)
    stop.set()
    assert not any(thread.is_alive() for thread in threads), "a request never got its answer"
    unexpected = [o for o in outcomes if o[0] != "ok" and "Exceeds maximum queue size" not in o[1]
                  and not re.search(r"unknown model|not found|unavailable|shutting down|unload", o[1], re.I)]
    assert not unexpected, unexpected
    assert ("bad", "") not in outcomes
    assert sum(o == ("ok", "") for o in outcomes) >= 6
    assert not admin.is_model_ready(MODEL)
    admin.load_model(MODEL)
    assert small_queue_server.is_ready(models=[MODEL])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_only_the_requested_outputs_come_back(triton_server, protocol):
    """A client asking for EMBEDDING alone gets it alone, equal to the full response's EMBEDDING.

    On Triton 2.51 an answer sent through a response sender that also carries outputs the client has
    not requested kills the stub (docs/known-issues.md); FastPath sends only the requested ones."""
    module = grpcclient if protocol == "grpc" else httpclient
    client = (grpcclient.InferenceServerClient(triton_server.grpc_url) if protocol == "grpc"
              else httpclient.InferenceServerClient(triton_server.http_url))
    texts = ["only the embedding, please", "and a second text"]
    full = client.infer(MODEL, _inputs(module, texts))
    for _ in range(3):
        result = client.infer(MODEL, _inputs(module, texts), outputs=[module.InferRequestedOutput("EMBEDDING")])
        np.testing.assert_allclose(result.as_numpy("EMBEDDING"), full.as_numpy("EMBEDDING"), atol=1e-6)
        assert result.as_numpy("TOKEN_COUNT") is None and result.as_numpy("MODEL_VERSION") is None
    both = client.infer(MODEL, _inputs(module, texts), outputs=[module.InferRequestedOutput("TOKEN_COUNT"),
                                                                 module.InferRequestedOutput("MODEL_VERSION")])
    assert both.as_numpy("EMBEDDING") is None
    np.testing.assert_array_equal(both.as_numpy("TOKEN_COUNT"), full.as_numpy("TOKEN_COUNT"))
    assert both.as_numpy("MODEL_VERSION").ravel().tolist() == [1, 1]
    assert triton_server.is_ready(models=[MODEL])


@pytest.fixture(scope="module")
def return_mode_server(tmp_path_factory):
    """text_embedding with response_mode=return; the shipped config's dynamic batcher (0 us) hands execute() every queued request."""
    def edit(config):
        assert "dynamic_batching { max_queue_delay_microseconds: 0 }" in config
        return config + 'parameters { key: "response_mode" value: { string_value: "return" } }\n'

    yield from _variant_server(tmp_path_factory, "return_mode", edit)


def test_return_mode_answers_each_request_once_with_its_own_rows(return_mode_server, triton_server, sentences):
    """response_mode=return: concurrent mixed requests (and bad ones among them) each get their own
    answer, equal to what the default mode gives the same text alone; bad ones fail alone."""
    texts = ["hello world", "", " ".join(["inference"] * 360)] + sentences[:: max(1, len(sentences) // 30)][:30]
    alone = np.stack([_embed(triton_server, [text])[0] for text in texts])

    def send(index):
        client = grpcclient.InferenceServerClient(return_mode_server.grpc_url)
        if index % 7 == 3:  # a bad request the model itself rejects: invalid UTF-8 in TEXT
            bad = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
            bad.set_data_from_numpy(np.array([[b"ok \xff\xfe"]], dtype=np.object_))
            try:
                client.infer(MODEL, [bad])
            except InferenceServerException as exc:
                return "bad", exc.status(), exc.message()
            return "bad", "answered", ""
        i = index % len(texts)
        outputs = [grpcclient.InferRequestedOutput("EMBEDDING")] if index % 2 else None
        return "good", i, client.infer(MODEL, _inputs(grpcclient, [texts[i]]), outputs=outputs).as_numpy("EMBEDDING")[0]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, range(90)))
    good = [(i, row) for kind, i, row in results if kind == "good"]
    bad = [(status, message) for kind, status, message in results if kind == "bad"]
    assert len(good) + len(bad) == 90 and len(bad) == 13
    for i, row in good:
        np.testing.assert_allclose(row, alone[i], atol=1e-5)
    assert all(status == "StatusCode.INVALID_ARGUMENT" and "TEXT[0] is not valid UTF-8" in message for status, message in bad)
    assert return_mode_server.is_ready(models=[MODEL])
    # Triton counts those 400s as successes; FastPath's own counter sees each one
    assert _metric_sum(_metrics(return_mode_server), "fastpath_invalid_requests_total", model=MODEL) == len(bad)


@pytest.fixture(scope="module")
def ask_all_server(tmp_path_factory):
    """text_embedding asking every request whether it was cancelled (cancel_check_after_us 0), with
    batches of at most 4 texts so a burst queues behind the engine."""
    def edit(config):
        config = re.sub(r'(key: "batch_buckets" value: \{ string_value: )"[^"]*"', r'\1"1,2,4"', config)
        return re.sub(r'(key: "cancel_check_after_us" value: \{ string_value: )"[^"]*"', r'\1"0"', config)

    yield from _variant_server(tmp_path_factory, "ask_all", edit)


def test_cancelled_requests_fail_alone_and_queued_ones_never_run(ask_all_server):
    """gRPC cancellation under Triton 2.51: of a burst of 48 long texts (batches of at most 4, over a
    second of engine work on 2 cores), the requests the client cancels while they wait in FastPath's
    queue are answered CANCELLED server-side and never run (fastpath_rejected_texts_total
    {reason="cancelled"}); one whose batch had formed runs and its answer goes nowhere. Each call gets
    exactly one callback: the kept ones their embedding, the cancelled ones CANCELLED (or their
    embedding, if it came first); the server carries on. The cancel waits 0.2 s, so every request has
    reached the queue (cancelled earlier, Triton drops it before the model sees it)."""
    text = " ".join(["cancellation"] * 250)
    client = grpcclient.InferenceServerClient(ask_all_server.grpc_url)
    before = _metric_sum(_metrics(ask_all_server), "fastpath_rejected_texts_total", reason="cancelled")
    callbacks = Callbacks()
    results = callbacks.results
    calls = [client.async_infer(MODEL, _inputs(grpcclient, [text]), callbacks.for_call(i)) for i in range(48)]
    time.sleep(0.2)
    for call in calls[8:]:
        call.cancel()
    assert callbacks.wait(48, timeout_s=180), f"{len(results)} of 48 answered"
    time.sleep(0.5)  # a second callback for any call would have arrived by now
    assert all(len(answers) == 1 for answers in results.values())
    for index in range(48):
        (result, error), = results[index]
        if error is None:
            assert result.as_numpy("EMBEDDING").shape == (1, 384)
        else:
            assert index >= 8 and "CANCELLED" in str(error.status()), (index, error)
    cancelled = _metric_sum(_metrics(ask_all_server), "fastpath_rejected_texts_total", reason="cancelled") - before
    assert 1 <= cancelled <= 40, cancelled
    assert ask_all_server.is_ready(models=[MODEL])
    assert _embed(ask_all_server, ["still serving"]).shape == (1, 384)
