"""The scheduler benchmark's arithmetic (benchmarks/scheduler_cpu.py, scheduler_report.py): a served cell
made of interleaved slices, its same-window yardstick, and the ratios the scheduler's goals are judged on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from scheduler_cpu import merge_slices  # noqa: E402
from scheduler_report import summarize  # noqa: E402

CPU = {"ours_cores": 1.9, "other_cores": 0.01, "steal_cores": 0.0}


def served_slice(texts: int, seconds: float, ideal_runs: list[float], latencies: list[float]) -> dict:
    return {"throughput_per_s": texts / seconds, "texts": texts, "seconds": seconds, "latencies_s": latencies,
            "errors": 0, "cpu": CPU, "ideal_runs_per_s": ideal_runs}


def test_a_cell_is_its_slices_pooled_against_the_raw_runs_beside_them():
    cell = merge_slices([served_slice(400, 2.0, [220.0, 260.0], [0.1, 0.2]),
                         served_slice(500, 2.0, [260.0, 300.0], [0.3])])
    assert cell["throughput_per_s"] == pytest.approx(225.0)  # 900 texts in 4 s
    assert cell["ideal_per_s"] == pytest.approx((240.0 + 280.0) / 2)  # mean of each slice's pair mean
    assert cell["ideal_strict_per_s"] == pytest.approx((260.0 + 300.0) / 2)  # the faster of each pair
    assert cell["slice_vs_ideal"] == [pytest.approx(200 / 240, abs=1e-3), pytest.approx(250 / 280, abs=1e-3)]
    assert cell["latencies_s"] == [0.1, 0.2, 0.3] and cell["ideal_runs_per_s"] == [220.0, 260.0, 260.0, 300.0]


def test_ratios_use_each_cells_own_yardstick_and_report_texts_per_call():
    def cell(texts_per_s: float, ideal: list[float], calls: float, texts: float) -> dict:
        merged = merge_slices([served_slice(int(texts_per_s * 2), 2.0, ideal, [0.05, 0.15])])
        merged.update(padded_tokens=110.0, real_tokens=100.0, engine_calls=calls, engine_texts=texts)
        return merged

    raw = {"throughput_per_s": 250.0, "cpu": CPU, "padded_tokens": 102.0, "real_tokens": 100.0, "latencies_s": []}
    rounds = {"raw": [{"raw_ideal": raw}], "mean_tokens": 29.0,
              "32": [{"raw_ideal": raw, "naive": cell(150.0, [240.0, 260.0], 0.0, 0.0),
                      "fastpath": cell(200.0, [190.0, 210.0], 50.0, 200.0)}]}
    report = summarize(rounds)
    ratios = report["ratios"]["32"]
    assert ratios["fastpath_vs_ideal"] == pytest.approx(1.0)  # 200 against its own slices' 200
    assert ratios["naive_vs_ideal"] == pytest.approx(0.6)
    assert ratios["fastpath_vs_naive"] == pytest.approx(1.0 / 0.6, abs=1e-3)  # the ratio of the two vs-ideal ratios
    assert ratios["fastpath_vs_ideal_strict"] == pytest.approx(200 / 210, abs=1e-3)
    assert report["served"]["fastpath"]["32"]["texts_per_call"] == 4.0
    assert report["served"]["fastpath"]["32"]["padding_waste"] == pytest.approx(1.1)
