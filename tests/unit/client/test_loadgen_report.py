"""Load-generator statistics, stability check, server split, and the JSON/PNG report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fastpath_client.loadgen import (
    LoadRun,
    LoadSettings,
    Record,
    is_stable,
    percentiles_ms,
    server_split,
    window_summary,
)
from fastpath_client.report import PHASE_COLORS, REST, has_responses, time_split_ms, write_json, write_png


def test_percentiles_in_ms():
    stats = percentiles_ms(np.arange(1, 101) / 1e3)
    assert stats["p50"] == pytest.approx(50.5) and stats["p99"] == pytest.approx(99.01)
    assert stats["max"] == 100 and stats["min"] == 1
    assert math.isnan(percentiles_ms(np.array([]))["p50"])


def test_window_summary_counts_successes_ending_inside():
    records = [Record(0.0, 0.5), Record(0.5, 1.2), Record(1.0, 1.5, "InvalidInputError: x"), Record(1.9, 2.1)]
    summary = window_summary(records, 1.0, 2.0)
    assert summary == {"throughput_per_s": 1.0, "p50_ms": pytest.approx(700.0)}


@pytest.mark.parametrize(("values", "stable"), [([100, 104, 97], True), ([100, 130, 97], False), ([100, 100], False)])
def test_stability_needs_three_windows_within_pct(values, stable):
    windows = [{"throughput_per_s": v, "p50_ms": 10.0} for v in values]
    assert is_stable(windows, 3, 10.0) is stable


def test_server_split_averages_the_deltas():
    before = {k: (10, 1000) for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")}
    before.update(inference_count=(10, 0), execution_count=(10, 0))
    after = dict(before, success=(30, 201000), queue=(30, 41000), compute_infer=(30, 101000),
                 inference_count=(50, 0), execution_count=(20, 0))
    split = server_split(before, after)
    assert split["requests"] == 20 and split["queue_us"] == pytest.approx(2.0)
    assert split["compute_infer_us"] == pytest.approx(5.0) and split["success_us"] == pytest.approx(10.0)
    assert math.isnan(split["compute_input_us"]) and split["avg_batch_size"] == pytest.approx(4.0)


def test_settings_need_one_mode():
    with pytest.raises(ValueError, match="exactly one"):
        LoadSettings(model="m", concurrency=2, request_rate=5.0)
    assert LoadSettings(model="m", request_rate=5.0).label == "r=5/s"


def _result(label, throughput, p50):
    return {"label": label, "stable": label != "c=8", "throughput_per_s": throughput, "items_per_s": throughput,
            "latency_ms": {"avg": p50 * 1.1, "p50": p50, "p90": p50 * 1.5, "p99": p50 * 2, "max": p50 * 3},
            "server": {"queue_us": 100.0 * p50, "compute_input_us": 50.0, "compute_infer_us": 800.0 * p50,
                       "compute_output_us": float("nan"), "success_us": 950.0 * p50}}


def test_report_json_is_standard_and_png_is_written(tmp_path):
    report = {"model": "text_embedding", "protocol": "http", "url": "127.0.0.1:8000",
              "settings": {"items_per_request": 1, "stable_windows": 3, "window_s": 1.0},
              "results": [_result("c=1", 20.0, 45.0), _result("c=8", 30.0, 260.0), _result("c=32", 31.0, 1000.0)]}
    path = write_json(report, tmp_path / "r.json")
    loaded = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert loaded["results"][0]["server"]["compute_output_us"] is None
    assert time_split_ms(report["results"][0])[REST] == pytest.approx(49.5 - 42.75)
    png = write_png(report, tmp_path / "r.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def _no_responses(label):
    """A configuration whose reported windows had no successful response (e.g. every request failed)."""
    nan = float("nan")
    return {"label": label, "stable": False, "throughput_per_s": 0.0, "items_per_s": 0.0,
            "latency_ms": dict.fromkeys(("avg", "min", "p50", "p90", "p95", "p99", "max"), nan),
            "server": {"queue_us": nan, "compute_input_us": nan, "compute_infer_us": nan, "compute_output_us": nan,
                       "success_us": nan}}


@pytest.mark.parametrize("results", [[_no_responses("c=1")], [_result("c=1", 20.0, 45.0), _no_responses("c=8")]],
                         ids=["none", "one-of-two"])
def test_report_of_a_window_without_responses_is_written_and_says_so(tmp_path, results):
    report = {"model": "text_embedding", "protocol": "http", "url": "127.0.0.1:8000",
              "settings": {"items_per_request": 1, "stable_windows": 3, "window_s": 1.0}, "results": results}
    assert not has_responses(results[-1]) and time_split_ms(results[-1]) == dict.fromkeys(PHASE_COLORS, 0.0)
    loaded = json.loads(write_json(report, tmp_path / "r.json").read_text())  # NaN -> null
    assert loaded["results"][-1]["latency_ms"]["p50"] is None and not has_responses(loaded["results"][-1])
    for name, source in (("from_run.png", report), ("from_json.png", loaded)):
        png = write_png(source, tmp_path / name)  # was: ValueError: Axis limits cannot be NaN or Inf
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_notes_windows_without_successful_responses():
    run = LoadRun(None, LoadSettings(model="m", concurrency=1, stable_windows=1, max_windows=1), lambda i: {})
    run.records = [Record(0.1, 0.5, "ServerError: boom"), Record(0.5, 0.9, "ServerError: boom")]
    stats = {k: (0, 0) for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                                 "inference_count", "execution_count")}
    summary = run._summary([0.0, 1.0], [stats, stats], [window_summary(run.records, 0.0, 1.0)])
    assert summary["note"] == "no successful responses in the reported windows (2 requests ended there, 2 with errors)"
    assert summary["errors"] == 2 and summary["throughput_per_s"] == 0.0 and math.isnan(summary["latency_ms"]["p50"])
    run.records.append(Record(0.2, 0.3))
    assert run._summary([0.0, 1.0], [stats, stats], [window_summary(run.records, 0.0, 1.0)])["note"] is None


def _exposition(queued_s, execution_s, inline_s=5.0, other_model_s=7.0):
    """A /metrics page written by prometheus_client's own exposition: FastPath's per-text time counters
    for text_embedding (two stub pids, queued and inline paths) and for another model."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    labels = ["model", "version", "pid", "path"]
    queue = Counter("fastpath_queue_duration_seconds", "queue", labels, registry=registry)
    run = Counter("fastpath_text_execution_seconds", "run", labels, registry=registry)
    for pid, share in (("11", 0.25), ("12", 0.75)):
        queue.labels("text_embedding", "1", pid, "queued").inc(queued_s * share)
        run.labels("text_embedding", "1", pid, "queued").inc(execution_s * share)
    queue.labels("text_embedding", "1", "11", "inline").inc(inline_s)
    run.labels("text_embedding", "1", "11", "inline").inc(inline_s)
    queue.labels("text_detection", "1", "13", "queued").inc(other_model_s)
    return generate_latest(registry).decode()


def test_queued_seconds_sum_the_models_queued_path_over_stubs():
    """Only path="queued" of the model counts (inline texts ran inside execute(), already in Triton's
    compute_infer), summed over stub pids; a page without the families gives zeros."""
    from fastpath_client.server_metrics import queued_seconds

    assert queued_seconds(_exposition(2.0, 0.5), "text_embedding") == {"queue": pytest.approx(2.0),
                                                                         "batch_run": pytest.approx(0.5)}
    assert queued_seconds("# HELP x y\n# TYPE x gauge\nx 1\n", "text_embedding") == {"queue": 0.0, "batch_run": 0.0}


def test_server_split_adds_fastpath_time_after_execute_per_text():
    """20 texts over the windows; FastPath's queued-path counters grew by 0.4 s (queue) and 0.16 s (batch
    run): 20,000 and 8,000 us per request of one text."""
    before = {k: (0, 0) for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                                  "inference_count", "execution_count")}
    before["fastpath"] = {"queue": 1.0, "batch_run": 2.0}
    after = dict(before, success=(20, 40_000_000), inference_count=(20, 0), execution_count=(4, 0),
                 fastpath={"queue": 1.4, "batch_run": 2.16})
    split = server_split(before, after)
    assert split["fastpath_queue_us"] == pytest.approx(20_000) and split["fastpath_batch_run_us"] == pytest.approx(8_000)
    triton_only = server_split({k: v for k, v in before.items() if k != "fastpath"}, after)
    assert "fastpath_queue_us" not in triton_only and triton_only["success_us"] == pytest.approx(2_000)


def test_time_split_puts_fastpath_time_between_triton_and_the_client():
    """At c=8 a request took 32 ms: 2 ms in Triton's phases, 20 ms queued in FastPath and 8 ms in its batch
    after execute() returned; what is left for client + network is 2 ms, not 30."""
    result = {"latency_ms": {"avg": 32.0},
              "server": {"queue_us": 200.0, "compute_input_us": 100.0, "compute_infer_us": 1500.0, "compute_output_us": 200.0,
                         "success_us": 2000.0, "fastpath_queue_us": 20_000.0, "fastpath_batch_run_us": 8_000.0}}
    split = time_split_ms(result)
    assert split["FastPath queue"] == pytest.approx(20.0) and split["FastPath batch run"] == pytest.approx(8.0)
    assert split[REST] == pytest.approx(2.0)
    assert list(split) == list(PHASE_COLORS)  # the chart stacks the phases in this order
    without = {"latency_ms": {"avg": 32.0}, "server": {k: v for k, v in result["server"].items() if "fastpath" not in k}}
    assert time_split_ms(without)[REST] == pytest.approx(30.0)  # Triton's statistics alone
