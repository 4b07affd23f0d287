"""A model instance's progress record and heartbeat (fastpath.triton.progress, fastpath.triton.heartbeat),
on a fake clock, with the real BatchRunner counting its batches."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fastpath.errors import ConfigError
from fastpath.scheduling import BatchRunner, FakeClock, Ticket, WorkItem
from fastpath.scheduling.config import SchedulerConfig
from fastpath.triton.heartbeat import Heartbeat, Progress, start_heartbeat
from fastpath.triton.progress import RECORD_BYTES, ProgressRecord, live_progress, progress_path, read_progress
from tests.conftest import wait_for
from tests.unit.scheduling.conftest import CPU, make_queue


def _record(**fields) -> ProgressRecord:
    base = dict(pid=4242, heartbeat_s=100.0, last_progress_s=90.0, accepted=5, answered=3, stall_timeout_s=30.0)
    return ProgressRecord(**{**base, **fields})


def test_a_record_survives_encoding_and_a_torn_or_foreign_one_is_refused():
    record = _record()
    data = record.encode()
    assert len(data) == RECORD_BYTES == 56
    assert ProgressRecord.decode(data) == record and record.in_flight == 2
    torn = data[:20] + bytes(8) + data[28:]  # half of a concurrent write: the CRC no longer matches
    assert ProgressRecord.decode(torn) is None
    assert ProgressRecord.decode(data[:-1]) is None
    assert ProgressRecord.decode(b"XXXX" + data[4:]) is None  # the CRC covers the magic too


@pytest.mark.parametrize(("fields", "now_s", "expected"), [
    ({}, 119.0, None),  # 2 in flight, 29 s since progress: within the 30 s
    ({}, 121.0, "2 requests in flight and no response sent and no batch finished for 31 s (stall_timeout_s 30)"),
    ({"answered": 5}, 125.0, None),  # idle: nothing in flight, a fresh heartbeat
    ({"answered": 5}, 131.0, "its heartbeat stopped 31 s ago (stall_timeout_s 30)"),  # stopped while idle
    ({"heartbeat_s": 95.0}, 126.0, "its heartbeat stopped 31 s ago"),  # the heartbeat goes first
    ({"stall_timeout_s": 0.0}, 1e6, None),  # not watched
])
def test_an_instance_stalls_with_work_in_flight_and_no_progress_or_with_no_heartbeat(fields, now_s, expected):
    """Invariant: stalled exactly when the heartbeat is older than stall_timeout_s, or requests are in
    flight and the last progress is older than it; never with stall_timeout_s 0."""
    why = _record(**fields).stalled(now_s)
    if expected is None:
        assert why is None
    else:
        assert why is not None and why.startswith(expected), why


def test_progress_counts_requests_and_restarts_the_stall_clock_when_work_arrives_at_an_idle_instance():
    clock = FakeClock(10.0)
    progress = Progress(clock.now)
    clock.advance(100.0)
    progress.accept(2)  # idle for 100 s, then work: the stall clock starts now, not at the last answer
    assert progress.record(1, 30.0).last_progress_s == 110.0
    clock.advance(5.0)
    progress.accept(1)  # more work while busy: no progress by itself
    clock.advance(5.0)
    progress.advance()  # a batch finished
    clock.advance(5.0)
    progress.answer(2)
    record = progress.record(7, 30.0)
    assert (record.pid, record.accepted, record.answered, record.in_flight) == (7, 3, 2, 1)
    assert (record.heartbeat_s, record.last_progress_s, record.stall_timeout_s) == (125.0, 125.0, 30.0)


class GatedHandler:
    """Stage/run/finish of a model whose engine call blocks until ``gate`` opens."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def stage(self, batch):
        return batch

    def run(self, batch):
        assert self.gate.wait(10), "test gate never opened"
        return [item.tokens for item in batch.items] + [None] * (batch.batch_size - len(batch.items))

    def finish(self, batch, outputs):
        for index, item in enumerate(batch.items):
            item.ticket.set_row(item.row, outputs[index])


def test_a_stuck_engine_stalls_the_instance_and_its_answers_end_the_stall():
    """The real BatchRunner with an engine call that does not return: the requests stay in flight, the
    published record says stalled once stall_timeout_s passes; when the engine returns, the answers and
    the finished batch are progress and nothing is in flight."""
    clock, handler = FakeClock(), GatedHandler()
    progress, answered = Progress(clock.now), threading.Semaphore(0)
    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=0.0), handler, clock=clock, on_delivered=progress.advance)
    runner.start()

    def answer(_ticket, _rows, _error):
        progress.answer()
        answered.release()

    try:
        for _ in range(3):
            progress.accept(1)  # as Replies does per execute() call
            ticket = Ticket(2, answer)
            runner.submit([WorkItem(ticket, row, 16, payload=None) for row in range(2)])
        clock.advance(29.0)
        assert progress.record(1, 30.0).stalled(clock.now()) is None
        clock.advance(2.0)
        assert progress.record(1, 30.0).stalled(clock.now()).startswith("3 requests in flight and no response sent")
        handler.gate.set()
        for _ in range(3):
            assert answered.acquire(timeout=10)
        record = progress.record(1, 30.0)
        assert record.in_flight == 0 and record.last_progress_s == clock.now()
        clock.advance(1000.0)
        assert progress.record(1, 30.0).stalled(clock.now()) is None  # idle, heartbeat fresh
    finally:
        handler.gate.set()
        runner.close(drain_timeout_s=10)


def test_the_heartbeat_writes_the_record_in_place_and_removes_it_at_close(tmp_path):
    clock = FakeClock(50.0)
    progress, flushes = Progress(clock.now), []
    path = progress_path(tmp_path, "m", "m_0_0", os.getpid())
    heartbeat = Heartbeat(path, progress, stall_timeout_s=12.0, interval_s=3600.0, on_beat=lambda: flushes.append(1)).start()
    try:
        assert read_progress(path) == ProgressRecord(pid=os.getpid(), heartbeat_s=50.0, last_progress_s=50.0, accepted=0,
                                                     answered=0, stall_timeout_s=12.0)
        inode = path.stat().st_ino
        progress.accept(4)
        clock.advance(2.0)
        heartbeat.beat()
        record = read_progress(path)
        assert (record.heartbeat_s, record.in_flight) == (52.0, 4) and path.stat().st_ino == inode
        assert len(flushes) == 2
    finally:
        heartbeat.close()
        heartbeat.close()
    assert not path.exists() and read_progress(path) is None


def test_start_heartbeat_publishes_under_the_state_dir_for_the_instance_and_not_when_unwatched(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTPATH_STATE_DIR", str(tmp_path / "state"))
    args = {"model_repository": str(tmp_path / "repo" / "text_detection"), "model_name": "text_detection",
            "model_instance_name": "text_detection_0_0"}
    assert start_heartbeat(args, Progress(), 0.0) is None
    heartbeat = start_heartbeat(args, Progress(), 60.0)
    try:
        path = tmp_path / "state" / "text_detection" / "progress" / f"text_detection_0_0.{os.getpid()}"
        assert heartbeat.path == path and read_progress(path).stall_timeout_s == 60.0
    finally:
        heartbeat.close()


def test_live_progress_keeps_records_of_running_stubs_only(tmp_path):
    """A record counts while its pid runs with the instance's name on its command line; a killed stub's file
    (its pid gone, or reused by another process) does not."""
    stub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "m_0_0"])
    try:  # /proc/<pid>/cmdline reads empty for a moment after exec (Popen returns as exec starts)
        assert wait_for(lambda: Path(f"/proc/{stub.pid}/cmdline").read_bytes(), timeout_s=10)
        for pid in (stub.pid, os.getpid(), 2**22 + 7):
            path = progress_path(tmp_path, "m", "m_0_0", pid)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_record(pid=pid).encode())
        assert live_progress(tmp_path, "m") == {f"m_0_0.{stub.pid}": _record(pid=stub.pid)}
        assert live_progress(tmp_path, "other") == {}
    finally:
        stub.kill()
        stub.wait()


def test_stall_timeout_s_is_a_scheduler_parameter_and_must_not_be_negative():
    assert SchedulerConfig().stall_timeout_s == 60.0
    with pytest.raises(ConfigError, match="stall_timeout_s"):
        SchedulerConfig(stall_timeout_s=-1.0)
