"""StubSupervisor's rules with a scripted process list, Triton API and clock (the real thing under
tritonserver: tests/e2e/test_stub_death.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from fastpath.server.stubs import Stub, StubSupervisor, check, expected_stubs, list_stubs, parse_stub_cmdline
from tests.conftest import wait_for

ARGV = ["/venv/pytriton/tritonserver/backends/python/triton_python_backend_stub", "/repo/text_embedding/1/model.py",
        "triton_python_backend_shm_region_x", "1048576", "1048576", "4242", "/venv/backends/python", "336",
        "text_embedding_0_0", "DEFAULT"]


class Api:
    """Triton as the supervisor sees it: which (model, version) are ready, and the reloads asked for."""

    def __init__(self, ready: set[tuple[str, str]], reload_ok: bool = True) -> None:
        self.ready, self.reload_ok, self.reloads = ready, reload_ok, []
        self.unanswered = 0  # the next this many readiness questions get no answer (RepositoryApi raises TimeoutError)

    def is_ready(self, model: str, version: str) -> bool:
        if self.unanswered:
            self.unanswered -= 1
            raise TimeoutError(f"no answer to whether model '{model}' version {version} is ready")
        return (model, version) in self.ready

    def reload(self, model: str) -> bool:
        self.reloads.append(model)
        return self.reload_ok


class Script:
    """The stubs alive now and the clock, both set by the test."""

    def __init__(self) -> None:
        self.stubs: list[Stub] = []
        self.now = 0.0


def _supervisor(script: Script, api: Api, **options) -> StubSupervisor:
    return StubSupervisor(lambda: list(script.stubs), api, clock=lambda: script.now, **options)


def test_the_stub_command_line_names_model_version_and_instance():
    assert parse_stub_cmdline(7, ARGV) == Stub(7, "text_embedding", "1", "text_embedding_0_0", 4242)
    assert parse_stub_cmdline(7, ["/usr/bin/python3", "x.py"]) is None
    assert parse_stub_cmdline(7, ARGV[:5]) is None


def test_list_stubs_reads_proc_and_skips_other_and_vanished_processes():
    assert list_stubs([os.getpid(), 2**22 + 12345]) == []  # this pytest process is no stub; the other pid does not exist


def test_list_stubs_keeps_instance_stubs_and_leaves_out_the_model_level_one(tmp_path):
    """Processes with a stub's command line (argv[0] set with bash's exec -a; they only sleep): the
    model-level stub Triton runs while loading (instance name = model name) is not an instance."""
    script = tmp_path / "m" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("import time\ntime.sleep(60)\n")
    processes = []
    try:
        for instance in ("m", "m_0_0"):
            args = [str(script), "shm_region", "1048576", "1048576", str(os.getpid()), "/lib", "336", instance, "DEFAULT"]
            processes.append(subprocess.Popen(["bash", "-c", 'exec -a /x/triton_python_backend_stub "$0" "$@"', sys.executable, *args]))
        pids = [process.pid for process in processes]
        # until bash has exec'd: then each process's argv[0] is the stub's name
        assert wait_for(lambda: all(Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"/x/triton_python_backend_stub")
                                    for pid in pids), timeout_s=10)
        assert list_stubs(pids) == [Stub(pids[1], "m", "1", "m_0_0", os.getpid())]
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_a_stub_gone_while_its_model_stays_ready_gets_the_model_reloaded_after_the_grace():
    script, api = Script(), Api({("text_embedding", "1")})
    stub = Stub(10, "text_embedding", "1", "text_embedding_0_0")
    supervisor = _supervisor(script, api, grace_s=2.0)
    script.stubs = [stub]
    supervisor.check()
    script.stubs, script.now = [], 1.0
    supervisor.check()
    assert api.reloads == []  # within the grace
    script.now = 3.5
    supervisor.check()
    assert api.reloads == ["text_embedding"] and supervisor.reloaded == ["text_embedding"]
    script.now = 10.0
    supervisor.check()
    assert api.reloads == ["text_embedding"]  # once per death
    script.stubs = [Stub(11, "text_embedding", "1", "text_embedding_0_0")]  # the reload's stub
    supervisor.check()
    assert supervisor.failure is None


def test_a_readiness_question_triton_leaves_unanswered_is_asked_again_and_the_death_still_reloads(caplog):
    """A busy tritonserver may not answer GET .../ready within its timeout. Invariant: no answer is never taken
    for "not ready" (which would forget the dead stub and leave every request failing for good): the stub stays
    missing, the next look asks again and reloads its model once; the warning is logged once per stub."""
    script, api = Script(), Api({("text_embedding", "1")})
    supervisor = _supervisor(script, api, grace_s=2.0)
    script.stubs = [Stub(10, "text_embedding", "1", "text_embedding_0_0")]
    supervisor.check()
    script.stubs, api.unanswered = [], 2
    for now in (1.0, 3.5, 4.0):  # gone at 1.0; past the grace at 3.5 and 4.0, without an answer
        script.now = now
        supervisor.check()
    assert api.reloads == [] and api.unanswered == 0
    script.now = 4.5
    supervisor.check()
    assert api.reloads == ["text_embedding"] and supervisor.failure is None
    warnings = [r.getMessage() for r in caplog.records if "cannot tell whether model 'text_embedding' is ready" in r.getMessage()]
    assert len(warnings) == 1 and "stub pid 10" in warnings[0]


def test_an_unload_and_a_reload_are_not_deaths():
    script, api = Script(), Api({("text_embedding", "1")})
    supervisor = _supervisor(script, api, grace_s=2.0)
    script.stubs = [Stub(10, "text_embedding", "1", "text_embedding_0_0")]
    supervisor.check()
    # reload: Triton starts the new stub (same instance name) before the old one stops
    script.stubs, script.now = [Stub(11, "text_embedding", "1", "text_embedding_0_0")], 5.0
    supervisor.check()
    script.now = 10.0
    supervisor.check()
    # unload: the model is no longer ready when its stub is gone
    api.ready.clear()
    script.stubs, script.now = [], 11.0
    supervisor.check()
    script.now = 20.0
    supervisor.check()
    assert api.reloads == [] and supervisor.failure is None


def test_another_version_with_the_same_instance_name_does_not_hide_a_death():
    script, api = Script(), Api({("m", "1"), ("m", "2")})
    supervisor = _supervisor(script, api, grace_s=1.0)
    script.stubs = [Stub(10, "m", "1", "m_0_0"), Stub(11, "m", "2", "m_0_0")]
    supervisor.check()
    script.stubs, script.now = [Stub(10, "m", "1", "m_0_0")], 1.0
    supervisor.check()
    script.now = 2.5
    supervisor.check()
    assert api.reloads == ["m"]


def test_a_crash_loop_gives_up_with_a_failure_after_max_reloads():
    script, api = Script(), Api({("m", "1")})
    supervisor = _supervisor(script, api, grace_s=1.0, max_reloads=2, window_s=100.0)
    for death in range(3):
        script.stubs = [Stub(20 + death, "m", "1", "m_0_0")]
        supervisor.check()
        script.stubs = []
        script.now += 0.5
        supervisor.check()
        script.now += 2.0
        supervisor.check()
    assert api.reloads == ["m", "m"]
    assert supervisor.failure is not None and "'m' died or stalled 3 times within 100 s" in supervisor.failure


class IndexApi:
    """Triton's repository index and model configs, as Triton 2.51 reports them."""

    def __init__(self, configs: dict[tuple[str, str], dict], failed: tuple[dict, ...] = ()) -> None:
        self.configs, self.failed = configs, list(failed)

    def index(self):
        return [{"name": m, "version": v, "state": "READY", "reason": ""} for m, v in self.configs] + self.failed

    def ready_models(self):
        return list(self.configs)

    def config(self, model, version):
        return self.configs[(model, version)]


CPU_CONFIG = {"backend": "python", "instance_group": [{"name": "text_embedding_0", "kind": "KIND_CPU", "count": 2, "gpus": []}]}
GPU_CONFIG = {"backend": "python", "instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}]}


def test_expected_stubs_counts_instances_of_python_models_only():
    assert expected_stubs(CPU_CONFIG) == 2
    assert expected_stubs(GPU_CONFIG) == 4  # count per listed GPU
    assert expected_stubs({"backend": "onnxruntime", "instance_group": [{"kind": "KIND_CPU", "count": 3}]}) == 0
    assert expected_stubs({"backend": "python"}) == 1


def test_check_names_each_ready_model_version_short_of_stubs():
    api = IndexApi({("text_embedding", "1"): CPU_CONFIG, ("fastpath_admin", "1"): {"backend": "python"}})
    both = [Stub(1, "text_embedding", "1", "text_embedding_0_0"), Stub(2, "text_embedding", "1", "text_embedding_0_1"),
            Stub(3, "fastpath_admin", "1", "fastpath_admin_0_0")]
    assert check(api, both) == []
    assert check(api, both[1:]) == ["text_embedding version 1: 1 of 2 python-backend stubs alive "
                                    "(Triton 2.51 reports it ready but fails every request)"]


def test_check_names_a_model_whose_load_failed_but_not_one_that_was_unloaded():
    failed = ({"name": "text_embedding", "version": "1", "state": "UNAVAILABLE", "reason": "ConfigError: bad value"},
              {"name": "other", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"})
    assert check(IndexApi({}, failed), []) == ["text_embedding version 1 failed to load: ConfigError: bad value"]


def test_a_reload_that_fails_stops_the_supervision_with_a_failure():
    script, api = Script(), Api({("m", "1")}, reload_ok=False)
    supervisor = _supervisor(script, api, grace_s=1.0)
    script.stubs = [Stub(10, "m", "1", "m_0_0")]
    supervisor.check()
    script.stubs, script.now = [], 2.0
    supervisor.check()
    script.now = 4.0
    supervisor.check()
    assert api.reloads == ["m"] and supervisor.failure is not None and "reloading model 'm'" in supervisor.failure


def test_the_replaced_generations_surviving_stubs_are_killed_after_the_drain():
    """Under load Triton 2.51 never finishes unloading a generation whose dead stub held requests, so its other
    stubs would live (and hold memory) until the server stops. Invariants: after the reload, each of them is
    killed once, and only after ``orphan_drain_s``; the reload's new stubs and other models' stubs are never
    signalled; a survivor that ends by itself is not signalled; and the survivors never count as the instances'
    stubs (their later death is no new death, no second reload)."""
    script, api = Script(), Api({("text_embedding", "1"), ("text_detection", "1")})
    signals: list[tuple[int, int]] = []
    supervisor = _supervisor(script, api, grace_s=2.0, orphan_drain_s=30.0, signal_stub=lambda pid, sig: signals.append((pid, sig)))
    old = [Stub(10 + k, "text_embedding", "1", f"text_embedding_0_{k}") for k in range(3)]
    other = Stub(20, "text_detection", "1", "text_detection_0_0")
    script.stubs = [*old, other]
    supervisor.check()
    script.stubs, script.now = [old[1], old[2], other], 1.0  # instance 0_0's stub died
    supervisor.check()
    script.now = 3.5
    supervisor.check()
    assert api.reloads == ["text_embedding"]
    new = [Stub(30 + k, "text_embedding", "1", f"text_embedding_0_{k}") for k in range(3)]
    script.stubs, script.now = [old[1], old[2], *new, other], 10.0
    supervisor.check()
    assert signals == []  # within the drain
    script.stubs, script.now = [old[1], *new, other], 20.0  # old[2] ended by itself
    supervisor.check()
    script.now = 34.0  # the drain ends 30 s after the reload (at 3.5 s)
    supervisor.check()
    assert signals == [(old[1].pid, signal.SIGKILL)] and supervisor.killed_orphans == [old[1].pid]
    script.stubs, script.now = [*new, other], 40.0
    supervisor.check()
    script.now = 50.0
    supervisor.check()
    assert signals == [(old[1].pid, signal.SIGKILL)] and api.reloads == ["text_embedding"] and supervisor.failure is None
