"""PhaseProfile: seconds and counts per phase, the JSON it writes, the timeline of spans, and that it is inert when off."""

import json
import threading
import time

from fastpath.profiling import PhaseProfile


def test_laps_accumulate_seconds_and_counts_and_dump_writes_them(tmp_path):
    profile = PhaseProfile(tmp_path / "phases")
    mark = profile.start()
    time.sleep(0.01)
    mark = profile.lap("execute.decode", mark, 3)
    profile.lap("execute.decode", mark, 2)
    profile.add("gpu.replay", 0.25, 1)
    snapshot = profile.snapshot()
    assert snapshot["execute.decode"]["count"] == 5
    assert snapshot["execute.decode"]["seconds"] >= 0.01
    assert snapshot["gpu.replay"] == {"seconds": 0.25, "count": 1}
    path = profile.dump("text_embedding_0_0")
    written = json.loads(path.read_text())
    assert written["phases"]["gpu.replay"] == {"seconds": 0.25, "count": 1}
    assert profile.dump("text_embedding_0_0", force=False) is None  # periodic dumps wait 10 s


def test_a_disabled_profile_records_and_writes_nothing(tmp_path):
    profile = PhaseProfile(None)
    assert profile.start() == 0.0 and profile.lap("execute.decode", 0.0) == 0.0
    profile.add("gpu.replay", 1.0)
    assert profile.snapshot() == {} and profile.dump("x") is None
    assert not list(tmp_path.iterdir())


def test_a_timeline_keeps_each_lap_as_a_span_of_its_thread_and_writes_chrome_trace_events(tmp_path):
    """Invariants: every lap is one complete event ("ph": "X") with its phase, count and thread; its start and
    duration are the lap's, in microseconds since the epoch; each thread is named once; the trace is written
    at a forced dump only, and without a sums directory no sums file is written."""
    profile = PhaseProfile(None, tmp_path / "timeline")
    assert profile.enabled
    before_us = time.time() * 1e6
    mark = profile.start()
    time.sleep(0.02)
    profile.lap("scheduler.run", mark, 16)
    worker = threading.Thread(target=lambda: profile.lap("post.db", profile.start()), name="post-0")
    worker.start()
    worker.join()
    assert profile.dump("text_detection_0_0", force=False) is None and not (tmp_path / "timeline").exists()
    assert profile.dump("text_detection_0_0") is None  # no sums directory: only the trace
    events = json.loads((tmp_path / "timeline" / "text_detection_0_0.trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert [(e["name"], e["cat"], e["args"]["count"]) for e in spans] == [("scheduler.run", "scheduler", 16), ("post.db", "post", 1)]
    run, post = spans
    assert run["dur"] >= 20_000 and before_us - 1_000 <= run["ts"] <= post["ts"] <= time.time() * 1e6
    assert names[run["tid"]] == threading.current_thread().name and names[post["tid"]] == "post-0"
    assert len(names) == 2


def test_a_timeline_keeps_only_the_most_recent_spans_and_reset_forgets_them(tmp_path):
    profile = PhaseProfile(None, tmp_path, max_spans=3)
    for k in range(5):
        profile.lap(f"phase.{k}", profile.start(), k)
    assert [e["name"] for e in profile.trace_events() if e["ph"] == "X"] == ["phase.2", "phase.3", "phase.4"]
    profile.reset()
    assert [e for e in profile.trace_events() if e["ph"] == "X"] == []


def test_a_timeline_that_cannot_be_written_is_a_warning_naming_the_path(tmp_path, caplog):
    """The serving path never fails over its profile: an unwritable timeline directory (here: below a file) costs
    the trace only, and the log says where it could not be written."""
    (tmp_path / "afile").write_text("")
    profile = PhaseProfile(None, tmp_path / "afile" / "sub")
    profile.lap("scheduler.run", profile.start())
    with caplog.at_level("WARNING", logger="fastpath.profiling"):
        assert profile.dump("text_detection_0_0") is None
    assert "could not write the timeline to" in caplog.text and "afile/sub/text_detection_0_0.trace.json" in caplog.text


def test_collections_are_timed_as_gc_phases_of_their_generation_until_close(tmp_path):
    """Invariants: with ``time_collections=True`` each garbage collection adds one count to ``gc.gen<generation>`` and
    its wall time, and one span on the collecting thread's timeline; after ``close`` none is recorded."""
    import gc

    profile = PhaseProfile(tmp_path / "phases", tmp_path / "timeline", time_collections=True)
    try:
        gc.collect(2)
        gc.collect(2)
        first = profile.snapshot()["gc.gen2"]
        assert first["count"] == 2 and first["seconds"] > 0
        spans = [event for event in profile.trace_events() if event.get("name") == "gc.gen2"]
        assert len(spans) == 2 and all(event["tid"] == threading.get_ident() for event in spans)
        profile.reset()
        assert "gc.gen2" not in profile.snapshot()
    finally:
        profile.close()
    gc.collect(2)
    assert "gc.gen2" not in profile.snapshot()
    assert profile._collection not in gc.callbacks


def test_a_profile_without_collections_leaves_the_garbage_collector_alone(tmp_path):
    import gc

    before = list(gc.callbacks)
    profile = PhaseProfile(tmp_path / "phases")
    gc.collect(0)
    assert gc.callbacks == before and not any(phase.startswith("gc.") for phase in profile.snapshot())
