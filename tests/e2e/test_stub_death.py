"""A python-backend stub killed under a running tritonserver: Triton 2.51 keeps the model ready but
fails every request; the container probe (``python -m fastpath.server.stubs --check``) says so, and
FastPath's stub supervisor (what ``fastpath serve`` runs) reloads the model."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastpath.cli.serve import stub_supervisor
from fastpath.server.process import group_members
from fastpath.server.stubs import list_stubs
from fastpath.server.stubs import main as check_stubs
from fastpath.server.triton_api import main as unload_all
from fastpath.swaps.control import ControlPlane, instance_key
from tests.conftest import start_server, wait_for

pytestmark = pytest.mark.e2e
MODEL = "text_embedding"
KEY = "test-stub-death-key"  # the supervisor's reload goes through the restricted repository API


def _embed(client, texts):
    array = np.array(texts, dtype=object).reshape(-1, 1)
    tensor = httpclient.InferInput("TEXT", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return client.infer(MODEL, [tensor]).as_numpy("EMBEDDING")


def _error(client, texts) -> str | None:
    try:
        _embed(client, texts)
    except InferenceServerException as exc:
        return exc.message()
    except (TimeoutError, OSError) as exc:  # a request taken by a killed stub is never answered: the client gives up
        return f"no answer: {exc!r}"
    return None


def _why_not_reloaded(supervisor, server) -> str:
    """What a failed wait for the reload shows: the supervisor's state, its journal, and the end of Triton's log."""
    log = server.log_path.read_text(errors="replace")[-4000:] if server.log_path else ""
    return (f"reloaded={supervisor.reloaded} failure={supervisor.failure!r} alive={supervisor.is_alive()} "
            f"recoveries={ControlPlane(server.state_dir, MODEL).recoveries()}\n--- tritonserver log ---\n{log}")


def test_a_killed_stub_is_replaced_by_a_reload_and_the_model_serves_again(tmp_path, sentences, monkeypatch):
    server = start_server(tmp_path, models=(MODEL,), admin_key=KEY)
    supervisor = stub_supervisor(server)
    monkeypatch.setenv("FASTPATH_ADMIN_KEY", KEY)  # the container probe reads the key from its environment
    probe = ["--check", "--http-port", str(server.options.http_port), "--server-pid", str(server.pid)]
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        texts = sentences[:8]
        expected = _embed(client, texts)
        assert check_stubs(probe) == 0
        supervisor.check()  # its first look (start() takes it too): the stub is alive
        (stub,) = [s for s in list_stubs(group_members(server.pid)) if s.model == MODEL]
        serving = ControlPlane(server.state_dir, MODEL).instances()[instance_key(stub.instance, stub.pid)]["active_version"]
        os.kill(stub.pid, signal.SIGKILL)
        # what Triton 2.51 does on its own: the model stays ready and every request fails
        assert wait_for(lambda: "is not healthy" in (_error(client, texts) or ""), timeout_s=1.5, poll_s=0.1)
        assert client.is_model_ready(MODEL)
        assert check_stubs(probe) == 1  # the container liveness probe fails
        supervisor.start()
        started = time.monotonic()
        assert wait_for(lambda: _error(client, texts) is None, timeout_s=60, poll_s=0.25), _error(client, texts)
        recovered_s = time.monotonic() - started
        np.testing.assert_allclose(_embed(client, texts), expected, atol=1e-5)
        assert supervisor.reloaded == [MODEL] and supervisor.failure is None
        (new,) = [s for s in list_stubs(group_members(server.pid)) if s.model == MODEL]
        assert new.pid != stub.pid and new.instance == stub.instance
        assert check_stubs(probe) == 0
        # the journal names both versions: Triton's version directory, and the FastPath version the dead stub served
        (recovery,) = ControlPlane(server.state_dir, MODEL).recoveries()
        assert (recovery["cause"], recovery["outcome"], recovery["instance"], recovery["pid"]) == ("died", "reloaded", stub.instance, stub.pid)
        assert (recovery["triton_version"], recovery["serving_version"]) == (stub.version, serving)
        # the Kubernetes preStop hook: unload (drain) every model before the SIGTERM
        supervisor.stop()
        assert unload_all(["--unload-all", "--http-port", str(server.options.http_port)]) == 0
        assert not client.is_model_ready(MODEL) and supervisor.reloaded == [MODEL]
        print(f"serving again {recovered_s:.1f} s after the stub's death was seen")
    finally:
        supervisor.stop()
        server.stop()


def test_under_load_the_replaced_generations_other_stubs_are_killed_and_serving_carries_on(tmp_path, sentences):
    """Three instances under a closed-loop load of 12 clients; one stub is killed. Triton 2.51 never finishes
    unloading that generation (its dead stub held requests), so the reload leaves its two other stubs alive.
    Invariants: once ``orphan_drain_s`` is over the model's stubs are the reload's three, the supervisor having
    killed only stubs of the replaced generation; every request sent after that is answered."""
    import threading

    repository = tmp_path / "repo" / MODEL
    repository.mkdir(parents=True)
    source = Path(__file__).resolve().parents[2] / "model_repository" / MODEL
    for item in source.iterdir():
        if item.name == "config.pbtxt":
            config = item.read_text()
            assert "count: 1" in config
            (repository / item.name).write_text(config.replace("count: 1", "count: 3", 1))
        elif item.name != "configs":
            (repository / item.name).symlink_to(item)
    server = start_server(tmp_path, models=(MODEL,), repository=repository.parent, admin_key=KEY)
    supervisor = stub_supervisor(server)
    supervisor.orphan_drain_s = 5.0
    stop, failures, phase = threading.Event(), [], {"after_reload": False}

    def load() -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=20)
        while not stop.is_set():
            sent_after_reload = phase["after_reload"]  # requests sent into the dead stub are never answered
            error = _error(client, sentences[:4])
            if error is not None and sent_after_reload:
                failures.append(error)
            if error is not None:
                time.sleep(0.05)

    def stubs() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for stub in list_stubs(group_members(server.pid)):
            if stub.model == MODEL:
                found.setdefault(stub.instance, []).append(stub.pid)
        return found

    clients = [threading.Thread(target=load, daemon=True) for _ in range(12)]
    try:
        before = stubs()
        assert len(before) == 3
        supervisor.check()
        for thread in clients:
            thread.start()
        time.sleep(2)
        os.kill(before["text_embedding_0_0"][0], signal.SIGKILL)
        supervisor.start()
        assert wait_for(lambda: supervisor.reloaded == [MODEL], timeout_s=120, poll_s=0.25), _why_not_reloaded(supervisor, server)
        survivors = sorted(before["text_embedding_0_1"] + before["text_embedding_0_2"])
        assert wait_for(lambda: all(len(pids) == 1 for pids in stubs().values()) and len(stubs()) == 3, timeout_s=60)
        phase["after_reload"] = True
        assert set(supervisor.killed_orphans) <= set(survivors)  # those Triton had not ended itself
        assert not set(survivors) & {pid for pids in stubs().values() for pid in pids}
        time.sleep(3)
        assert failures == []
    finally:
        stop.set()
        supervisor.stop()
        server.stop()
        for thread in clients:
            thread.join(timeout=30)
