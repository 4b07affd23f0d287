"""The serving-version record: what a reload or restart reads to come back on the version last swapped to."""

import json
import os
import threading

import pytest

from fastpath.errors import InvalidInputError, SwapError, VersionRecordError
from fastpath.swaps.admin import AdminService
from fastpath.swaps.agent import SwapAgent
from fastpath.swaps.control import ControlPlane
from fastpath.swaps.record import RECORD_NAME, STATE_DIR_ENV, VersionRecord, read_record, record_path, write_record
from fastpath.swaps.slots import EngineSlots


class Engine:
    def __init__(self, version):
        self.version = version
        self.closed = False

    def close(self):
        self.closed = True


def _refuse_3(engine, version):
    if version == 3:
        raise ValueError("golden check failed: cosine 0.42 below 0.99")


@pytest.fixture
def repository(tmp_path, monkeypatch):
    monkeypatch.delenv(STATE_DIR_ENV, raising=False)
    root = tmp_path / "repo"
    for version in (1, 2, 3):
        (root / "m" / str(version)).mkdir(parents=True)
    (root / "m" / "config.pbtxt").write_text('name: "m"')
    return root


def _agent(state, slots, record_path_, record=None, name="m_0"):
    return SwapAgent(ControlPlane(state, "m"), name, slots, Engine, _refuse_3, poll_s=0.002, watch=False,
                     record_path=record_path_, record=record).start()


def test_the_record_lives_beside_config_pbtxt_unless_a_state_directory_is_set(repository, tmp_path, monkeypatch):
    """Invariant: record_path is <model dir>/serving_version.json, or $FASTPATH_VERSION_STATE_DIR/<model>.json when set."""
    assert record_path(repository / "m") == repository / "m" / RECORD_NAME
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "volume"))
    assert record_path(repository / "m") == tmp_path / "volume" / "m.json"


def test_a_written_record_reads_back_field_for_field(tmp_path):
    record = VersionRecord(version=2, previous_version=1, since=1234.5, reason="rollback", state_dir="/s", generation=7, ok=False)
    write_record(tmp_path / "r.json", record)
    assert read_record(tmp_path / "r.json") == record
    assert read_record(tmp_path / "absent.json") is None  # never swapped: no record, no error
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # the temporary file was renamed, none left behind


@pytest.mark.parametrize(("text", "problem"), [
    ("{not json", "is not a JSON record (Expecting property name"),
    ("", "is empty"),
    ('{"previous_version": 1}', "has no version field (keys: ['previous_version'])"),
    ('{"version": 0}', "version 0: expected an integer >= 1"),
    ('{"version": "2"}', "version '2': expected an integer >= 1"),
    ('{"version": true}', "version True: expected an integer >= 1"),
    ('{"version": 2, "previous_version": false}', "previous_version False: expected an integer >= 1 or null"),
    ('{"version": 2, "reason": 7}', "reason 7: expected a string such as loaded, swap, rollback"),
    ('{"version": 2, "since": 1e400}', "since inf: expected seconds since the epoch"),
    ('{"version": 2, "command": [1]}', "command [1]: expected an object"),
    ('{"version": 2, "command": {"generation": "3", "ok": "yes"}}',
     "command.generation '3': expected an integer >= 0; command.ok 'yes': expected true or false"),
    ("[2]", "holds a JSON array, not an object"),
    ("null", "holds a JSON null, not an object"),
    ('"two"', "holds a JSON string, not an object"),
    ("2.0", "holds a JSON number, not an object"),
])
def test_a_corrupt_record_is_refused_naming_the_file_and_the_problem(tmp_path, text, problem):
    """Invariant: the message is 'record unreadable: <path>: <problem>' naming the field, its value and the expectation."""
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(VersionRecordError) as info:
        read_record(tmp_path / "r.json")
    assert str(info.value).startswith(f"record unreadable: {tmp_path / 'r.json'}: ")
    assert problem in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_an_unwritable_record_names_the_variable_that_moves_it(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(VersionRecordError, match=STATE_DIR_ENV):
        write_record(tmp_path / "ro" / "r.json", VersionRecord(version=1))


def test_a_swap_is_recorded_before_its_flip_and_a_failed_record_flips_nothing(tmp_path):
    """Invariant: commit(version, active) runs after validation, before the flip; if it raises, the old version serves."""
    slots = EngineSlots(1, Engine(1))
    seen = []
    slots.swap(2, Engine, lambda e, v: None, commit=lambda new, old: seen.append((new, old, slots.active_version)))
    assert seen == [(2, 1, 1)] and slots.active_version == 2

    def refuse(new, old):
        raise VersionRecordError("cannot record the serving version in /ro")

    with pytest.raises(SwapError, match="refused while recording: cannot record"):
        slots.swap(3, Engine, lambda e, v: None, commit=refuse)
    assert slots.active_version == 2 and slots.status().previous_version == 1


def test_the_agent_records_each_swap_and_each_refusal(repository, tmp_path):
    """A successful swap writes version/previous/reason/generation; a refused one keeps the version, ok false."""
    state, path = tmp_path / "state", record_path(repository / "m")
    slots = EngineSlots(1, Engine(1))
    agent = _agent(state, slots, path)
    service = AdminService(repository, state, "k", timeout_s=10)
    try:
        reply = service.handle({"command": "swap", "model": "m", "version": 2, "key": "k"})
        assert reply["active_version"] == 2 and reply["recorded"]["version"] == 2
        record = read_record(path)
        assert (record.version, record.previous_version, record.reason, record.ok) == (2, 1, "swap", True)
        assert record.applied(state, 1)
        with pytest.raises(SwapError, match="cosine 0.42"):
            service.handle({"command": "swap", "model": "m", "version": 3, "key": "k"})
        record = read_record(path)
        assert (record.version, record.previous_version, record.ok, record.generation) == (2, 1, False, 2)
        assert reply["instances"]["m_0"]["serving_reason"] == "swap"
    finally:
        agent.stop()


def test_rollback_returns_to_the_recorded_previous_version(repository, tmp_path):
    """A rollback is posted as a swap to the record's previous_version, so it works after a restart too."""
    state, path = tmp_path / "state", record_path(repository / "m")
    write_record(path, VersionRecord(version=2, previous_version=1, reason="swap"))
    slots = EngineSlots(2, Engine(2), previous_version=1)  # what a restarted instance restores
    agent = _agent(state, slots, path)
    try:
        reply = AdminService(repository, state, "k", timeout_s=10).handle({"command": "rollback", "model": "m", "key": "k"})
        assert reply["active_version"] == 1 and slots.active_version == 1
        assert json.loads(path.read_text())["reason"] == "rollback" and read_record(path).previous_version == 2
        assert ControlPlane(state, "m").desired()["command"] == "swap"
    finally:
        agent.stop()


def test_an_instance_that_loads_while_a_swap_is_applied_applies_it_too(repository, tmp_path):
    """Invariant: a command posted before an instance started is history unless it is a swap the record
    does not show as applied; then the instance converges on it (a reload racing a swap)."""
    state, path = tmp_path / "state", record_path(repository / "m")
    plane = ControlPlane(state, "m")
    generation = plane.post("swap", version=2, reason="swap")  # posted; no instance has applied it yet
    late = EngineSlots(1, Engine(1))
    agent = _agent(state, late, path, record=read_record(path), name="m_new")
    try:
        assert _wait(lambda: late.active_version == 2)
        assert _wait(lambda: plane.instances()["m_new"]["generation"] == generation)
        assert read_record(path).applied(state, generation)
    finally:
        agent.stop()
    # once the record shows the command applied, a later instance leaves it as history
    settled = EngineSlots(1, Engine(1))
    agent = _agent(state, settled, path, record=read_record(path), name="m_later")
    try:
        assert agent.generation == generation and not agent.poll_once() and settled.active_version == 1
    finally:
        agent.stop()


def test_a_swap_reply_never_names_a_version_an_instance_does_not_serve(repository, tmp_path):
    """An instance that reports the generation but serves another version makes the swap fail, naming both."""
    state = tmp_path / "state"
    plane = ControlPlane(state, "m")
    stop = threading.Event()

    def stuck_instance():  # applies every command's generation but stays on version 1
        while not stop.wait(0.002):
            desired = plane.desired() or {}
            plane.report("m_stuck", {"generation": desired.get("generation", 0), "ok": True, "active_version": 1})

    plane.report("m_stuck", {"generation": 0, "ok": True, "active_version": 1})
    thread = threading.Thread(target=stuck_instance, daemon=True)
    thread.start()
    try:
        with pytest.raises(SwapError, match=r"asked for version 2, but its instances serve \[1\]"):
            AdminService(repository, state, "k", timeout_s=10).handle({"command": "swap", "model": "m", "version": 2, "key": "k"})
    finally:
        stop.set()
        thread.join()


def _wait(predicate, timeout_s=10.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def test_a_swap_refused_for_want_of_live_instances_is_never_applied_by_a_later_load(repository, tmp_path):
    """Invariant: a swap answered 'not loaded' leaves no command behind: an instance loading later stays on its version,
    also when the instances left while the swap waited (the admin then posts a cancel)."""
    state = tmp_path / "state"
    plane = ControlPlane(state, "m")
    service = AdminService(repository, state, "k", timeout_s=10)
    with pytest.raises(InvalidInputError, match="not loaded.*nothing was changed"):
        service.handle({"command": "swap", "model": "m", "version": 2, "key": "k"})
    assert plane.desired() is None
    plane.report("m_leaving", {"generation": 0, "ok": True, "active_version": 1})
    instances_dir = plane.instances_dir
    threading.Timer(0.05, lambda: (instances_dir / "m_leaving.json").unlink()).start()  # unloaded while the swap waits
    with pytest.raises(InvalidInputError, match="not loaded"):
        service.handle({"command": "swap", "model": "m", "version": 2, "key": "k"})
    assert plane.desired()["command"] == "cancel"
    late = EngineSlots(1, Engine(1))
    agent = _agent(state, late, record_path(repository / "m"), name="m_new")
    try:
        assert not agent.poll_once() and late.active_version == 1
    finally:
        agent.stop()


def test_status_and_rollback_answer_with_an_unreadable_record(repository, tmp_path):
    """Invariant: with a record that cannot be read, status reports its problem and rollback still returns
    to the previous version the live instances report, rewriting the record; with no previous version
    the refusal names the record's problem."""
    state, path = tmp_path / "state", record_path(repository / "m")
    slots = EngineSlots(1, Engine(1))
    agent = _agent(state, slots, path)
    service = AdminService(repository, state, "k", timeout_s=10)
    try:
        path.write_bytes(b"[" * 30_000 + b"]" * 30_000)
        with pytest.raises(SwapError, match=r"nothing to roll back to: m has not been swapped .*record unreadable: .*nested too deeply"):
            service.handle({"command": "rollback", "model": "m", "key": "k"})
        assert service.handle({"command": "swap", "model": "m", "version": 2, "key": "k"})["active_version"] == 2
        path.write_bytes(b"\xff\xfe garbage")
        status = service.handle({"command": "status", "model": "m"})
        assert status["active_version"] == 2 and status["recorded"]["error"].startswith(f"record unreadable: {path}: is not UTF-8")
        assert service.handle({"command": "rollback", "model": "m", "key": "k"})["active_version"] == 1
        assert (read_record(path).version, read_record(path).previous_version, read_record(path).reason) == (1, 2, "rollback")
    finally:
        agent.stop()
