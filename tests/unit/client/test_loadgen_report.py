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
from fastpath_client.report import PHASE_COLORS, has_responses, time_split_ms, write_json, write_png


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
    assert time_split_ms(report["results"][0])["client + network"] == pytest.approx(49.5 - 42.75)
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
