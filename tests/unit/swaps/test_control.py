"""Control plane, swap agent and admin service together, over a real state directory and threads."""

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fastpath.errors import FastPathError, InvalidInputError, PermissionDeniedError, SwapError
from fastpath.swaps import agent as agent_module
from fastpath.swaps.admin import AdminService
from fastpath.swaps.agent import SwapAgent
from fastpath.swaps.control import ControlPlane
from fastpath.swaps.slots import EngineSlots


class Engine:
    def __init__(self, version):
        self.version = version

    def close(self):
        pass


def _refuse_3(engine, version):
    if version == 3:
        raise ValueError("golden check failed: cosine 0.42 below 0.99")


@pytest.fixture(params=[True, False], ids=["inotify", "polling"])
def setup(tmp_path, request):
    repository = tmp_path / "repo"
    for version in (1, 2, 3):
        (repository / "m" / str(version)).mkdir(parents=True)
    (repository / "m" / "config.pbtxt").write_text('name: "m"')
    state = tmp_path / "state"
    slots = EngineSlots(1, Engine(1))
    agents = [SwapAgent(ControlPlane(state, "m"), "m_0", slots, Engine, _refuse_3, poll_s=0.002, watch=request.param).start()]
    assert agents[0].watching is request.param
    service = AdminService(repository, state, "s3cret", timeout_s=10)
    yield service, slots
    for agent in agents:
        agent.stop()


def test_swap_rollback_status_through_the_files(setup):
    service, slots = setup
    reply = service.handle({"command": "swap", "model": "m", "version": 2, "key": "s3cret"})
    assert reply["active_version"] == 2 and slots.active_version == 2
    assert reply["instances"]["m_0"]["ok"] is True
    assert service.handle({"command": "status", "model": "m"})["active_version"] == 2
    assert service.handle({"command": "rollback", "model": "m", "key": "s3cret"})["active_version"] == 1
    assert service.handle({"command": "versions", "model": "m"})["versions"] == ["1", "2", "3"]


def test_refused_version_reports_reason_and_keeps_serving(setup):
    service, slots = setup
    with pytest.raises(SwapError, match="golden check failed: cosine 0.42.*still serving version \\[1\\]"):
        service.handle({"command": "swap", "model": "m", "version": 3, "key": "s3cret"})
    assert slots.active_version == 1
    status = service.handle({"command": "status", "model": "m"})["instances"]["m_0"]
    assert status["ok"] is False and "cosine 0.42" in status["error"]


@pytest.mark.parametrize("key", [None, "", "wrong"])
def test_swap_without_the_key_is_refused(setup, key):
    service, slots = setup
    with pytest.raises(PermissionDeniedError, match="admin key missing or wrong"):
        service.handle({"command": "swap", "model": "m", "version": 2, "key": key})
    assert slots.active_version == 1


def test_a_refused_swap_or_rollback_is_logged_with_its_reason_and_never_the_key(setup, caplog):
    """Invariant: every swap or rollback the admin service refuses leaves one WARNING naming the command, the
    model, the version and the reason, so failed admin attempts show in the server's log; the key never does."""
    service, _ = setup
    attempts = [({"command": "swap", "model": "m", "version": 2, "key": "wrong"}, "admin key missing or wrong"),
                ({"command": "swap", "model": "m", "version": 9, "key": "s3cret"}, "version 9 of m is not in the repository"),
                ({"command": "rollback", "model": "m", "key": "s3cret"}, "nothing to roll back to")]
    with caplog.at_level(logging.WARNING, logger="fastpath.swaps.admin"):
        for request, _ in attempts:
            with pytest.raises(FastPathError):
                service.handle(request)
        service.handle({"command": "status", "model": "m"})  # reads are not logged
    lines = [record.getMessage() for record in caplog.records if record.name == "fastpath.swaps.admin"]
    assert [line.split(": ", 1)[0] for line in lines] == [
        "swap of model 'm' to version 2 refused", "swap of model 'm' to version 9 refused",
        "rollback of model 'm' to version 'previous' refused"]
    assert all(reason in line for line, (_, reason) in zip(lines, attempts)) and not any("s3cret" in line for line in lines)


@pytest.mark.parametrize(
    ("request_doc", "match"),
    [
        ({"command": "reload", "model": "m"}, "not one of swap, rollback"),
        ({"command": "status", "model": "../etc"}, "not in the model repository"),
        ({"command": "swap", "model": "m", "version": 9, "key": "s3cret"}, r"version 9 of m is not in the repository; available: \['1', '2', '3'\]"),
        ({"command": "swap", "model": "m", "version": "2", "key": "s3cret"}, r"'version' must be an integer version of m \(1, 2, 3\); got '2'"),
        ({"command": "swap", "model": "m", "version": True, "key": "s3cret"}, "'version' must be an integer .* got True"),
        ({"command": "swap", "model": "m", "version": 2.0, "key": "s3cret"}, "'version' must be an integer .* got 2.0"),
        ({"command": "swap", "model": "m", "key": "s3cret"}, "'version' must be an integer .* got None"),
        ({}, "'command' is required, one of swap, rollback, status, versions"),
        ({"command": "status"}, "'model' is required, a model name string; got None"),
        ({"command": "status", "model": 7}, "'model' is required, a model name string; got 7"),
        ({"command": "status", "model": "m" * 300}, "not in the model repository"),  # longer than a file name can be
        ({"command": "status", "model": ".."}, "not in the model repository"),
    ],
)
def test_bad_commands_are_400s(setup, request_doc, match):
    service, _ = setup
    with pytest.raises(InvalidInputError, match=match):
        service.handle(request_doc)


def test_no_key_configured_disables_swaps(tmp_path, setup):
    service, _ = setup
    closed = AdminService(service.model_repository, service.state_root, "")
    with pytest.raises(PermissionDeniedError, match="started without FASTPATH_ADMIN_KEY"):
        closed.handle({"command": "swap", "model": "m", "version": 2, "key": "anything"})


def test_concurrent_swaps_are_serialized_per_instance(setup):
    service, slots = setup
    results = []

    def swap(version):
        try:
            results.append(service.handle({"command": "swap", "model": "m", "version": version, "key": "s3cret"})["active_version"])
        except SwapError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=swap, args=(v,)) for v in (2, 1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 3 and slots.active_version in (1, 2)


def test_status_reports_pickup_and_the_instance_details(tmp_path):
    (tmp_path / "repo" / "m" / "2").mkdir(parents=True)
    (tmp_path / "repo" / "m" / "config.pbtxt").write_text('name: "m"')
    slots = EngineSlots(1, Engine(1))
    agent = SwapAgent(ControlPlane(tmp_path / "state", "m"), "m_0", slots, Engine, _refuse_3, poll_s=0.002,
                      details=lambda: {"last_swap_stages_s": {"engine_load_s": 0.25}}).start()
    try:
        reply = AdminService(tmp_path / "repo", tmp_path / "state", "k", timeout_s=10).handle(
            {"command": "swap", "model": "m", "version": 2, "key": "k"})
    finally:
        agent.stop()
    status = reply["instances"]["m_0"]
    assert 0 <= status["pickup_s"] < 5 and status["seconds"] >= 0
    assert status["last_swap_stages_s"] == {"engine_load_s": 0.25}


def test_concurrent_posts_get_distinct_generations_and_the_last_one_stays(tmp_path):
    """Posts are serialized: without the lock a stale read-increment-write could overwrite a newer
    generation, and the instance would never see the command its caller waited for."""
    plane = ControlPlane(tmp_path / "state", "m")
    generations = []
    lock = threading.Lock()

    def post(version):
        generation = ControlPlane(tmp_path / "state", "m").post("swap", version=version)
        with lock:
            generations.append(generation)

    threads = [threading.Thread(target=post, args=(v,)) for v in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(generations) == list(range(1, 41))
    assert plane.desired()["generation"] == 40


def _counted_plane(tmp_path, monkeypatch):
    """A repository with model m version 2, its control plane, and the list that grows by one per stat of desired.json."""
    (tmp_path / "repo" / "m" / "2").mkdir(parents=True)
    (tmp_path / "repo" / "m" / "config.pbtxt").write_text('name: "m"')
    plane = ControlPlane(tmp_path / "state", "m")
    stats = []
    stamp = plane.desired_stamp
    monkeypatch.setattr(plane, "desired_stamp", lambda: stats.append(1) or stamp())
    return plane, stats


def test_a_watching_agent_is_woken_by_the_post_and_otherwise_sleeps(tmp_path, monkeypatch):
    """With inotify the agent's thread sleeps until desired.json is replaced: with the safety-net
    re-check pushed to 60 s, a swap still completes (the post woke it), and while idle it reads the
    file's stat only at heartbeats, where polling every 5 ms read it ~100 times in 0.5 s."""
    monkeypatch.setattr(agent_module, "WATCH_RECHECK_S", 60.0)
    plane, stats = _counted_plane(tmp_path, monkeypatch)
    slots = EngineSlots(1, Engine(1))
    agent = SwapAgent(plane, "m_0", slots, Engine, _refuse_3, poll_s=0.005).start()
    try:
        assert agent.watching
        threading.Event().wait(0.5)
        assert len(stats) <= 2
        reply = AdminService(tmp_path / "repo", tmp_path / "state", "k", timeout_s=10).handle(
            {"command": "swap", "model": "m", "version": 2, "key": "k"})
    finally:
        agent.stop()
    assert reply["active_version"] == 2 and slots.active_version == 2


def test_without_inotify_simple_the_agent_warns_and_polls_every_poll_s(tmp_path, monkeypatch, caplog):
    """Where inotify_simple cannot be imported the agent says so once, naming the package, and polls
    desired.json every POLL_S (50 ms: 20 wakes a second, not 200); a posted swap still applies."""
    monkeypatch.setitem(sys.modules, "inotify_simple", None)  # import raises ImportError
    plane, stats = _counted_plane(tmp_path, monkeypatch)
    slots = EngineSlots(1, Engine(1))
    with caplog.at_level(logging.WARNING, logger=agent_module.LOG.name):
        agent = SwapAgent(plane, "m_0", slots, Engine, _refuse_3).start()
    try:
        assert not agent.watching
        assert agent_module.POLL_S == 0.05
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "inotify_simple is not installed" in warnings[0] and "every 50 ms" in warnings[0]
        threading.Event().wait(0.5)
        assert 5 <= len(stats) <= 12  # ~10 polls in 0.5 s (at 5 ms: ~100)
        reply = AdminService(tmp_path / "repo", tmp_path / "state", "k", timeout_s=10).handle(
            {"command": "swap", "model": "m", "version": 2, "key": "k"})
    finally:
        agent.stop()
    assert reply["active_version"] == 2 and slots.active_version == 2


def test_the_polling_warning_names_the_agents_own_period(tmp_path, monkeypatch, caplog):
    """Invariant: without inotify_simple the warning gives the period the agent polls at, its ``poll_s``."""
    monkeypatch.setitem(sys.modules, "inotify_simple", None)
    plane, _ = _counted_plane(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger=agent_module.LOG.name):
        agent = SwapAgent(plane, "m_0", EngineSlots(1, Engine(1)), Engine, _refuse_3, poll_s=0.02).start()
    agent.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "every 20 ms" in warnings[0] and "50 times a second" in warnings[0]


def _exited_pid() -> int:
    """The process id of a child that has exited and been reaped: no process has it (until the id is reused)."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                              check=True).stdout)


def test_an_instance_whose_process_is_gone_is_not_live(tmp_path):
    """A status record is live only while its heartbeat is fresh AND its process exists: the record of a stub
    that died moments ago (fresh heartbeat, no process) is not live, the reporting process's own is."""
    plane = ControlPlane(tmp_path, "text_embedding")
    plane.report("text_embedding_0_0.pid1", {"generation": 3, "ok": True, "active_version": 1})
    dead_pid = _exited_pid()
    record = plane.instances_dir / "text_embedding_0_1.pid2.json"
    record.write_text(json.dumps({"instance": "text_embedding_0_1.pid2", "generation": 3, "ok": True, "active_version": 1,
                                  "heartbeat": time.time(), "pid": dead_pid}))
    assert list(plane.instances()) == ["text_embedding_0_0.pid1"]
    assert plane.instances()["text_embedding_0_0.pid1"]["pid"] == os.getpid()



@pytest.mark.skipif(not Path("/proc").is_dir(), reason="zombie state is read from /proc (Linux)")
def test_an_instance_whose_process_is_a_zombie_is_not_live(tmp_path):
    """A killed stub stays a zombie until tritonserver reaps it, and kill(pid, 0) succeeds on a zombie: its record
    (fresh heartbeat) is not live all the same, while a running child's is."""
    plane = ControlPlane(tmp_path, "text_embedding")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed.kill()
        deadline = time.time() + 10
        while Path(f"/proc/{killed.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z" and time.time() < deadline:
            time.sleep(0.01)  # not reaped (no wait()): a zombie, as a killed stub of tritonserver is
        for name, pid in (("text_embedding_0_0.pid1", running.pid), ("text_embedding_0_1.pid2", killed.pid)):
            plane.instances_dir.mkdir(parents=True, exist_ok=True)
            (plane.instances_dir / f"{name}.json").write_text(json.dumps(
                {"instance": name, "generation": 3, "ok": True, "active_version": 1, "heartbeat": time.time(), "pid": pid}))
        assert list(plane.instances()) == ["text_embedding_0_0.pid1"]
    finally:
        running.kill()
        running.wait()
        killed.wait()


def test_a_swap_right_after_a_stub_died_does_not_wait_for_it(setup, tmp_path):
    """A swap posted while a dead stub's record still has a fresh heartbeat (it died a moment ago) completes
    with the live instance within seconds, instead of waiting out the admin's 10 s timeout for the dead one."""
    service, slots = setup
    plane = ControlPlane(tmp_path / "state", "m")
    ghost = {**plane.instances()["m_0"], "instance": "m_1", "generation": 0, "heartbeat": time.time(), "pid": _exited_pid()}
    (plane.instances_dir / "m_1.json").write_text(json.dumps(ghost))
    started = time.monotonic()
    reply = service.handle({"command": "swap", "model": "m", "version": 2, "key": "s3cret"})
    assert reply["active_version"] == 2 and slots.active_version == 2
    assert list(reply["instances"]) == ["m_0"]
    assert time.monotonic() - started < 5.0


def test_a_post_into_a_broken_state_directory_fails_naming_the_file(tmp_path):
    """A post whose lock file cannot be opened (here a directory stands where .post.lock goes) is refused as a
    SwapError naming the file, the OS's reason and what is expected, and posts nothing."""
    plane = ControlPlane(tmp_path / "state", "m")
    (tmp_path / "state" / "m" / ".post.lock").mkdir(parents=True)
    with pytest.raises(SwapError) as info:
        plane.post("swap", version=2)
    assert str(info.value) == (f"cannot post swap in the state directory {tmp_path / 'state' / 'm'}: "
                               f"{tmp_path / 'state' / 'm' / '.post.lock'}: Is a directory; expected a writable directory "
                               "of regular files (FASTPATH_STATE_DIR); nothing was changed")
    assert plane.desired() is None
