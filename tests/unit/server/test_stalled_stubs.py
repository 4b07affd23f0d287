"""A stub that stopped answering: the stub supervisor and the liveness check read its progress record
(scripted process list, Triton API, records and clock here; the real thing under tritonserver:
tests/e2e/test_stalled_stub.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from fastpath.server.stubs import Stub, StubSupervisor, check, stub_progress
from fastpath.swaps.admin import AdminService
from fastpath.swaps.control import ControlPlane
from fastpath.triton.progress import ProgressRecord, progress_path
from tests.conftest import wait_for
from tests.unit.server.test_stubs import Api, IndexApi, Script

STUB = Stub(10, "text_detection", "1", "text_detection_0_0")


def _record(pid: int = 10, *, heartbeat_s: float = 100.0, last_progress_s: float = 100.0, in_flight: int = 0,
            stall_timeout_s: float = 30.0) -> ProgressRecord:
    return ProgressRecord(pid=pid, heartbeat_s=heartbeat_s, last_progress_s=last_progress_s, accepted=7 + in_flight,
                          answered=7, stall_timeout_s=stall_timeout_s)


class Stalls:
    """The supervisor's view of the stubs' records, the signals it sends, and what it journals."""

    def __init__(self, script: Script, api: Api, **options) -> None:
        self.records: dict[int, ProgressRecord] = {}
        self.signals: list[tuple[int, int]] = []
        self.sleeps: list[float] = []
        self.events: list[tuple[str, dict]] = []
        self.supervisor = StubSupervisor(lambda: list(script.stubs), api, clock=lambda: script.now,
                                         progress=lambda stub: self.records.get(stub.pid),
                                         signal_stub=lambda pid, signum: self.signals.append((pid, signum)),
                                         sleep=self.sleeps.append, journal=lambda model, event: self.events.append((model, event)),
                                         **options)


def test_a_stalled_stub_gets_its_stacks_dumped_then_killed_and_its_model_reloaded():
    """In flight and no progress for more than stall_timeout_s: SIGUSR1, a pause, SIGKILL, one reload,
    and a journal entry saying why; not before the timeout has passed."""
    script, api = Script(), Api({("text_detection", "1")})
    stalls = Stalls(script, api, stack_dump_wait_s=0.5)
    script.stubs, script.now = [STUB], 129.0
    stalls.records[10] = _record(heartbeat_s=128.5, in_flight=3)
    stalls.supervisor.check()
    assert api.reloads == [] and stalls.signals == []
    script.now = 131.0
    stalls.records[10] = _record(heartbeat_s=130.5, in_flight=3)
    stalls.supervisor.check()
    assert stalls.signals == [(10, signal.SIGUSR1), (10, signal.SIGKILL)] and stalls.sleeps == [0.5, 0.0]
    assert api.reloads == ["text_detection"] and stalls.supervisor.reloaded == ["text_detection"]
    (model, started), (_, event) = stalls.events  # journalled as the reload starts, then its outcome
    assert started == {**event, "outcome": "reloading"}
    assert model == "text_detection" and event["cause"] == "stalled" and event["outcome"] == "reloaded"
    assert event["detail"].startswith("3 requests in flight and no response sent and no batch finished for 31 s")
    assert (event["instance"], event["pid"], event["triton_version"]) == ("text_detection_0_0", 10, "1")
    script.stubs = []  # the killed stub is gone: not a second death
    script.now = 140.0
    stalls.supervisor.check()
    assert api.reloads == ["text_detection"]


def test_a_stopped_stub_is_seen_by_its_old_heartbeat_even_with_nothing_in_flight():
    script, api = Script(), Api({("text_detection", "1")})
    stalls = Stalls(script, api)
    script.stubs, script.now = [STUB], 131.0
    stalls.records[10] = _record(heartbeat_s=100.0)
    stalls.supervisor.check()
    assert api.reloads == ["text_detection"]
    assert stalls.events[0][1]["detail"].startswith("its heartbeat stopped 31 s ago")


def test_no_record_an_unwatched_record_or_a_model_that_is_not_ready_is_left_alone():
    script, api = Script(), Api({("text_detection", "1")})
    stalls = Stalls(script, api)
    other = Stub(11, "text_embedding", "1", "text_embedding_0_0")
    script.stubs, script.now = [STUB, other], 1000.0
    stalls.records[11] = _record(11, heartbeat_s=0.0, stall_timeout_s=0.0)  # stall_timeout_s 0: not watched
    stalls.supervisor.check()
    stalls.records[10] = _record(heartbeat_s=0.0, in_flight=1)
    api.ready.clear()  # being unloaded: its drain is Triton's business
    stalls.supervisor.check()
    assert api.reloads == [] and stalls.signals == [] and stalls.events == []


def test_two_stalled_instances_of_one_model_cost_one_reload():
    script, api = Script(), Api({("m", "1")})
    stalls = Stalls(script, api)
    script.stubs, script.now = [Stub(10, "m", "1", "m_0_0"), Stub(11, "m", "1", "m_0_1")], 500.0
    stalls.records = {10: _record(10, heartbeat_s=0.0), 11: _record(11, heartbeat_s=0.0)}
    stalls.supervisor.check()
    assert api.reloads == ["m"] and [pid for pid, _ in stalls.signals] == [10, 10]


def test_stalls_count_toward_max_reloads_with_deaths():
    script, api = Script(), Api({("m", "1")})
    stalls = Stalls(script, api, max_reloads=1, grace_s=1.0)
    script.stubs, script.now = [Stub(10, "m", "1", "m_0_0")], 500.0
    stalls.supervisor.check()
    script.stubs, script.now = [], 502.0  # a death: the first reload, after the grace
    stalls.supervisor.check()
    script.now = 503.5
    stalls.supervisor.check()
    script.stubs, script.now = [Stub(12, "m", "1", "m_0_0")], 504.0
    stalls.records[12] = _record(12, heartbeat_s=400.0)  # then a stall
    stalls.supervisor.check()
    assert api.reloads == ["m"] and "'m' died or stalled 2 times" in stalls.supervisor.failure
    assert [(event["cause"], event["outcome"].split(":")[0]) for _, event in stalls.events] == [
        ("died", "reloading"), ("died", "reloaded"), ("stalled", "not reloaded")]


def test_the_liveness_check_names_a_stalled_stub_of_a_ready_model():
    api = IndexApi({("text_detection", "1"): {"backend": "python"}})
    records = {10: _record(heartbeat_s=100.0, in_flight=2, last_progress_s=70.0)}
    assert check(api, [STUB], progress=lambda stub: records.get(stub.pid), now_s=99.0) == []
    assert check(api, [STUB], progress=lambda stub: records.get(stub.pid), now_s=101.0) == [
        "text_detection version 1 instance text_detection_0_0 (stub pid 10) stopped answering: 2 requests in flight "
        "and no response sent and no batch finished for 31 s (stall_timeout_s 30)"]
    assert check(IndexApi({}), [STUB], progress=lambda stub: records.get(stub.pid), now_s=1e6) == []  # not ready


def test_stub_progress_finds_the_record_through_the_stubs_own_state_dir(tmp_path):
    """A process with FASTPATH_STATE_DIR in its environment (as tritonserver's stubs have): its record is
    found there; a record naming another pid is not its own."""
    env = {**os.environ, "FASTPATH_STATE_DIR": str(tmp_path / "state")}
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        # /proc/<pid>/environ reads empty for a moment after exec (Popen returns as exec starts)
        assert wait_for(lambda: Path(f"/proc/{process.pid}/environ").read_bytes(), timeout_s=10)
        stub = Stub(process.pid, "m", "1", "m_0_0")
        assert stub_progress(stub) is None
        path = progress_path(tmp_path / "state", "m", "m_0_0", process.pid)
        path.parent.mkdir(parents=True)
        path.write_bytes(_record(process.pid).encode())
        assert stub_progress(stub) == _record(process.pid)
        path.write_bytes(_record(process.pid + 1).encode())
        assert stub_progress(stub) is None
    finally:
        process.kill()
        process.wait()
    assert stub_progress(stub) is None  # gone


def test_a_reloads_outcome_replaces_its_reloading_entry(tmp_path):
    """Invariant: one entry per recovery, keyed by (at, pid): the outcome replaces the entry written as the reload
    started; another recovery's entry stays."""
    plane = ControlPlane(tmp_path, "m")
    plane.note_recovery({"at": 1.0, "pid": 7, "cause": "died", "outcome": "reloaded"})
    plane.note_recovery({"at": 5.0, "pid": 9, "cause": "stalled", "outcome": "reloading"})
    assert [e["outcome"] for e in plane.recoveries()] == ["reloaded", "reloading"]
    plane.note_recovery({"at": 5.0, "pid": 9, "cause": "stalled", "outcome": "reloaded"})
    assert [(e["pid"], e["outcome"]) for e in plane.recoveries()] == [(7, "reloaded"), (9, "reloaded")]


def test_recoveries_keep_the_last_ten_and_a_damaged_file_reads_as_none(tmp_path):
    plane = ControlPlane(tmp_path, "m")
    assert plane.recoveries() == []
    for n in range(12):
        plane.note_recovery({"cause": "died", "n": n})
    assert [event["n"] for event in plane.recoveries()] == list(range(2, 12))
    for damaged in (b"\xff\xfe", b"[" * 200000 + b"]" * 200000, b'{"recoveries": 3}', b"[]"):
        plane.recoveries_path.write_bytes(damaged)
        assert plane.recoveries() == []


def test_admin_status_shows_each_running_instance_progress_and_the_recorded_reloads(tmp_path):
    """`status` of a model without live swaps: its running stubs' records (stalled or not, and why) and the
    supervisor's reloads with their causes; a record whose stub is gone is left out."""
    (tmp_path / "repo" / "m").mkdir(parents=True)
    (tmp_path / "repo" / "m" / "config.pbtxt").write_text('name: "m"')
    now = [200.0]
    service = AdminService(tmp_path / "repo", tmp_path / "state", "", clock=lambda: now[0])
    stub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "m_0_0"])
    try:
        assert wait_for(lambda: Path(f"/proc/{stub.pid}/cmdline").read_bytes(), timeout_s=10)
        for pid in (stub.pid, 2**22 + 3):
            path = progress_path(tmp_path / "state", "m", "m_0_0", pid)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_record(pid, heartbeat_s=199.5, last_progress_s=160.0, in_flight=2).encode())
        ControlPlane(tmp_path / "state", "m").note_recovery({"cause": "stalled", "outcome": "reloaded"})
        reply = service.handle({"command": "status", "model": "m"})
    finally:
        stub.kill()
        stub.wait()
    assert reply["instances"] == {} and reply["recoveries"] == [{"cause": "stalled", "outcome": "reloaded"}]
    (progress,) = reply["progress"].values()
    assert list(reply["progress"]) == [f"m_0_0.{stub.pid}"]
    assert {key: progress[key] for key in ("pid", "in_flight", "seconds_since_progress", "seconds_since_heartbeat")} == {
        "pid": stub.pid, "in_flight": 2, "seconds_since_progress": 40.0, "seconds_since_heartbeat": 0.5}
    assert progress["stalled"].startswith("2 requests in flight and no response sent and no batch finished for 40 s")
