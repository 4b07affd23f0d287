"""PhaseProfile: seconds and counts per phase, the JSON it writes, and that it is inert when off."""

import json
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
