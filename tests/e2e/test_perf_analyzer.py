"""perf_analyzer (benchmarks/perf_analyzer.py) loads the real tritonserver with real texts over gRPC and HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import perf_analyzer as pa  # noqa: E402

from tests.conftest import wait_for  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(pa.missing_reason() is not None, reason=str(pa.missing_reason()))]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_timed_run_answers_every_request(triton_server, sentences, tmp_path, protocol):
    """2 s of closed-loop load at concurrency 4 from corpus texts (and one non-ASCII text sent as b64 bytes): perf_analyzer
    reports no failed request, the window's throughput is > 0, and every answered request carries version 1's
    unit-length 384-float embedding, sent before it was answered."""
    texts = sentences[:300]
    entries = pa.text_entries(texts) + [{"TEXT": {**pa.bytes_element("naïve café ☕".encode()), "shape": [1]}}]
    data = pa.write_input_data(tmp_path / "in.json", entries)
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    load = pa.Load(model="text_embedding", url=url, protocol=protocol, data=data, concurrency=4)
    result = pa.timed(pa.find(), load, 2.0, tmp_path / "export.json")
    assert result.errors == []
    stats = pa.window(result.requests, result.started_s + 0.5, result.started_s + 2.0)
    assert stats["completed"] > 0 and stats["throughput_per_s"] > 0 and stats["latencies_s"]
    assert result.requests[0].sent_s >= result.started_s - 0.5  # perf_analyzer's clock is time.time()'s
    for request in result.requests:
        assert request.done_s > request.sent_s
        assert request.outputs["MODEL_VERSION"] == 1
        assert np.linalg.norm(request.outputs["EMBEDDING"]) == pytest.approx(1.0, abs=1e-4)


def test_stable_cell_reads_its_csv(triton_server, sentences, tmp_path):
    """perf_analyzer's own measurement: a CSV row with throughput > 0, ordered percentiles and the server's times."""
    data = pa.write_input_data(tmp_path / "in.json", pa.text_entries(sentences[:300]))
    load = pa.Load(model="text_embedding", url=triton_server.grpc_url, data=data, concurrency=2)
    cell = pa.stable_cell(pa.find(), load, measurement_ms=700, csv_path=tmp_path / "cell.csv", stability_pct=50)
    assert cell["req_per_s"] > 0 and cell["concurrency"] == 2
    assert 0 < cell["p50_us"] <= cell["p90_us"] <= cell["p99_us"]
    assert cell["server_compute_infer_us"] > 0


def test_failed_requests_are_reported(triton_server, sentences, tmp_path):
    """A text that is not UTF-8 fails its request; perf_analyzer stops and the error names the tensor and the byte."""
    bad = {"TEXT": {**pa.bytes_element(b"\xff\xfe"), "shape": [1]}}
    data = pa.write_input_data(tmp_path / "in.json", pa.text_entries(sentences[:5]) + [bad])
    load = pa.Load(model="text_embedding", url=triton_server.grpc_url, data=data, concurrency=1)
    with pytest.raises(pa.PerfAnalyzerError, match="failed request") as raised:
        pa.timed(pa.find(), load, 3.0, tmp_path / "export.json")
    assert raised.value.errors and all("TEXT[0] is not valid UTF-8" in error for error in raised.value.errors)


def test_a_timed_run_that_meets_a_failed_request_ends_on_its_own(triton_server, sentences, tmp_path):
    """A timed run stops at a failed request without being told: exited() turns True while nobody has sent it SIGINT,
    and stop() then raises with the failed request's error (its requests were all answered: not ``unanswered``)."""
    bad = {"TEXT": {**pa.bytes_element(b"\xff\xfe"), "shape": [1]}}
    data = pa.write_input_data(tmp_path / "in.json", pa.text_entries(sentences[:5]) + [bad])
    run = pa.TimedRun(pa.find(), pa.Load(model="text_embedding", url=triton_server.grpc_url, data=data, concurrency=1), None)
    try:
        assert not run.exited()  # not started
        run.start()
        assert wait_for(run.exited, timeout_s=30, poll_s=0.1)
        with pytest.raises(pa.PerfAnalyzerError, match="failed request") as raised:
            run.stop()
        assert raised.value.errors and "TEXT[0] is not valid UTF-8" in raised.value.errors[0] and not raised.value.unanswered
    finally:
        run.__exit__(None, None, None)


def test_timed_run_without_export_counts_in_tritons_statistics(triton_server, sentences, tmp_path):
    """Without a profile export the run records no request, and every request it sent shows in Triton's success count."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(triton_server.grpc_url)

    def served() -> int:
        stats = client.get_inference_statistics("text_embedding", as_json=True)["model_stats"]
        return sum(int(version["inference_stats"]["success"].get("count", 0)) for version in stats)

    data = pa.write_input_data(tmp_path / "in.json", pa.text_entries(sentences[:100]))
    before = served()
    result = pa.timed(pa.find(), pa.Load(model="text_embedding", url=triton_server.grpc_url, data=data, concurrency=2), 1.5, None)
    assert result.requests == [] and result.errors == [] and result.ended_s > result.started_s
    assert served() > before


def test_a_run_that_cannot_start_raises_once_and_leaves_nothing_to_end(tmp_path):
    """perf_analyzer against a port nothing listens on exits before its load begins. Invariant: start() raises
    PerfAnalyzerError with its output, and the cleanup after it (the ``with`` block's exit, as a soak's load loop
    runs it in ``finally``) neither raises nor waits: the process was reaped once, by start()."""
    data = pa.write_input_data(tmp_path / "in.json", pa.text_entries(["a text"]))
    run = pa.TimedRun(pa.find(), pa.Load(model="text_embedding", url="127.0.0.1:9", data=data, concurrency=1), None)
    with pytest.raises(pa.PerfAnalyzerError) as failure:
        run.start()
    assert "perf_analyzer" in str(failure.value)
    run.__exit__(None, None, None)
    assert not run.exited()
