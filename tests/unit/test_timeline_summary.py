"""benchmarks/timeline.py: a window of FastPath's timeline summed per phase, and each phase's overlap with the engine.

Invariants, on spans whose answers are known by hand:
* busy seconds sum each phase's spans cut to the window (over threads), mean threads = busy / window, the active
  share is the union of a phase's spans over the window;
* a phase's engine overlap is the share of the engine phase's union during which the phase's union is active;
* the Chrome trace a stub writes (fastpath.profiling) reads back span for span;
* a served cell sums its own model's instances only (not a model whose name extends it), with the engine phase the
  traces have (the scheduler's, else a return-mode model's ``execute.run``), and keeps its window as a trace;
* the command line sums each model's traces apart, and refuses a non-positive window or a file that is not a trace
  with a message naming it (no traceback).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from timeline import Span, busiest_window, cell_summaries, intersection_length, load_spans, main, merged, model_of, summary  # noqa: E402

from fastpath.profiling import PhaseProfile  # noqa: E402


def test_unions_and_their_intersection():
    assert merged([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert intersection_length([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert intersection_length([(0, 1)], [(2, 3)]) == 0


def test_a_span_shorter_than_the_trace_resolution_counts_where_it_starts():
    """A span whose start equals its end (it ran under the traces' microsecond resolution) counts in a window that
    it starts in, including one starting at that very instant, and not in a window it starts before or at the end of."""
    spans = [Span("execute.run", 100.0, 100.0, 1, 1, 2), Span("execute.run", 100.5, 100.7, 1, 2, 2)]
    assert summary(spans, 100.0, 105.0, engine="execute.run")["phases"]["execute.run"]["units"] == 4
    assert summary(spans, 100.2, 105.0, engine="execute.run")["phases"]["execute.run"]["units"] == 2
    assert summary(spans, 99.0, 100.0, engine="execute.run")["phases"].get("execute.run") is None


def test_busy_share_and_engine_overlap_of_a_two_batch_pipeline():
    spans = [
        Span("scheduler.run", 0, 10, 1, 1, 16), Span("scheduler.run", 20, 30, 1, 1, 16),
        Span("execute.decode", 5, 25, 1, 2, 8), Span("execute.decode", 6, 12, 1, 3, 8),  # two decode threads
        Span("post.db", 30, 34, 1, 4, 16),  # after the engine: no overlap
        Span("post.db", 38, 45, 1, 4, 1),  # cut to the window's end at 40
    ]
    result = summary(spans, 0, 40)
    assert result["window_s"] == 40 and result["engine_busy_share"] == 0.5
    decode = result["phases"]["execute.decode"]
    assert decode == {"spans": 2, "units": 16, "busy_s": 26.0, "mean_threads": 0.65, "active_share": 0.5, "threads": 2,
                      "engine_overlap": 0.5}  # union 5..25 covers 5..10 and 20..25 of the engine's 20 s
    post = result["phases"]["post.db"]
    assert post["busy_s"] == 6.0 and post["units"] == 17 and post["engine_overlap"] == 0.0
    assert result["phases"]["scheduler.run"]["engine_overlap"] is None


def test_the_default_window_ends_with_the_last_engine_span():
    spans = [Span("execute.decode", 0, 1, 1, 1), Span("scheduler.run", 2, 3, 1, 1), Span("scheduler.run", 9, 10, 1, 1)]
    assert busiest_window(spans, 5) == (5, 10)
    assert busiest_window(spans, 50) == (2, 52)


def test_a_stub_trace_reads_back_span_for_span(tmp_path):
    profile = PhaseProfile(None, tmp_path)
    mark = profile.start()
    mark = profile.lap("scheduler.stage", mark, 4)
    profile.lap("scheduler.run", mark, 4)
    profile.dump("text_detection_0_0")
    spans = load_spans([tmp_path / "text_detection_0_0.trace.json"])
    assert [(s.phase, s.count) for s in spans] == [("scheduler.stage", 4), ("scheduler.run", 4)]
    assert spans[0].end_s == pytest.approx(spans[1].start_s, abs=2e-6) and all(s.end_s >= s.start_s for s in spans)


def test_a_cell_sums_its_own_models_instances_with_the_engine_phase_they_have(tmp_path):
    traces, cuts = tmp_path / "timeline", tmp_path / "out"
    cuts.mkdir()
    for instance, phase in (("text_embedding_rt_0_0", "execute.run"), ("text_embedding_rt_0_1", "execute.run"),
                            ("text_embedding_rt_blocking_0_0", "scheduler.run")):
        profile = PhaseProfile(None, traces)
        mark = profile.start()
        mark = profile.lap("execute.tokenize", mark, 8)
        profile.lap(phase, mark, 8)
        profile.dump(instance)
    spans = load_spans(traces.glob("*.trace.json"))
    window = (spans[0].start_s, max(s.end_s for s in spans) + 1)
    result = cell_summaries(traces, {"text_embedding_rt:short:64": window}, cuts)["text_embedding_rt:short:64"]
    assert result["instances"] == 2 and result["engine_phase"] == "execute.run"
    assert result["phases"]["execute.tokenize"]["units"] == 16 and "scheduler.run" not in result["phases"]
    cut = (cuts / "timeline_text_embedding_rt_short_c64.trace.json").read_text()
    assert cut.count('"execute.run"') == 2
    late = cell_summaries(traces, {"text_embedding_rt:short:1": (window[0] - 60, window[1])}, cuts)["text_embedding_rt:short:1"]
    assert "no spans from" in late["error"]  # the window began before the oldest kept span


def test_the_command_line_sums_each_models_traces_apart(tmp_path, capsys):
    for instance, phase in (("text_detection_0_0", "scheduler.run"), ("text_embedding_0_0", "execute.run"),
                            ("text_embedding_0_1", "execute.run")):
        profile = PhaseProfile(None, tmp_path)
        profile.lap(phase, profile.start(), 2)
        profile.dump(instance)
    assert model_of(tmp_path / "text_embedding_rt_0_11.trace.json") == "text_embedding_rt"
    assert main([*map(str, sorted(tmp_path.glob("*.trace.json"))), "--seconds", "5", "--out", str(tmp_path / "s.json")]) == 0
    result = json.loads((tmp_path / "s.json").read_text())
    assert sorted(result) == ["text_detection", "text_embedding"]
    assert result["text_detection"]["engine_phase"] == "scheduler.run" and result["text_embedding"]["engine_phase"] == "execute.run"
    assert result["text_embedding"]["phases"]["execute.run"]["units"] == 4
    assert "text_embedding (2 instance trace(s))" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [(["--seconds", "0"], "--seconds must be > 0, got 0"),
                                           (["--seconds", "-5"], "--seconds must be > 0, got -5")])
def test_the_command_line_refuses_a_window_that_is_not_positive(tmp_path, capsys, args, message):
    (tmp_path / "a_0_0.trace.json").write_text('{"traceEvents": []}')
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "a_0_0.trace.json"), *args])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("content", [None, "{}", "not json", '{"traceEvents": 3}'])
def test_the_command_line_names_a_file_that_is_not_a_trace(tmp_path, capsys, content):
    path = tmp_path / "x_0_0.trace.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as stopped:
        main([str(path)])
    assert stopped.value.code == 2 and f"{path}: " in capsys.readouterr().err
