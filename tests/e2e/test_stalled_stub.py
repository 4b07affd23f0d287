"""A python-backend stub that stops answering under a running tritonserver (SIGSTOP with requests
inside it): Triton 2.51 keeps the model ready while the requests inside hang and new ones fail; the
liveness probe (``python -m fastpath.server.stubs --check``) fails once ``stall_timeout_s`` passes,
FastPath's stub supervisor (what ``fastpath serve`` runs) kills the stub and reloads the model, logs
why, and ``fastpath status`` shows the reload and its cause; then the model serves again."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from fastpath.cli import main as cli
from fastpath.cli.serve import stub_supervisor
from fastpath.server.process import group_members
from fastpath.server.stubs import list_stubs, stub_progress
from fastpath.server.stubs import main as check_stubs
from tests.conftest import MODEL_REPOSITORY, start_server, variant_repository, wait_for
from tests.e2e.test_text_detection import MODEL, detect_bytes
from tests.unit.models.text_detection.reference import skimage_path

pytestmark = pytest.mark.e2e
KEY = "test-stalled-stub-key"  # the supervisor's reload goes through the restricted repository API
STALL_TIMEOUT_S = 4  # a few heartbeats (1 s); the shipped default is 60
# a stopped stub's last record shows requests in flight, so either verdict may come first
STALLED = r"(its heartbeat stopped \d+ s ago|\d+ requests in flight and no response sent and no batch finished for \d+ s)"


def _stub(server):
    (stub,) = [s for s in list_stubs(group_members(server.pid)) if s.model == MODEL]
    return stub


def _status(server, capsys) -> dict:
    """`fastpath status text_detection` against the server, its JSON reply."""
    capsys.readouterr()
    assert cli.main(["status", MODEL, "--url", server.http_url]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _probe(args, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = check_stubs(args)
    return code, capsys.readouterr().err


def _send_in_background(server, outcome: list[str]) -> threading.Thread:
    """One request of eight white 736x2752 images as a raw array (its execute() returns within milliseconds,
    its engine work takes seconds), sent from a thread that appends "answered" or the error to ``outcome``."""
    images = np.full((8, 736, 2752, 3), 255, np.uint8)

    def send():
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
        tensor = httpclient.InferInput("IMAGE", list(images.shape), "UINT8")
        tensor.set_data_from_numpy(images)
        try:
            client.infer(MODEL, [tensor])
            outcome.append("answered")
        except Exception as exc:  # inside the stopped stub it gets no answer (Triton 2.51) until the server stops
            outcome.append(str(exc))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_stopped_stub_fails_liveness_is_reloaded_and_serves_again(tmp_path, monkeypatch, capsys, caplog):
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    repository = variant_repository(tmp_path, MODEL, stall_timeout_s=str(STALL_TIMEOUT_S))
    shutil.copytree(MODEL_REPOSITORY / "fastpath_admin", repository / "fastpath_admin", ignore=shutil.ignore_patterns("__pycache__"))
    server = start_server(tmp_path, models=(MODEL, "fastpath_admin"), repository=repository, admin_key=KEY)
    supervisor = stub_supervisor(server)
    monkeypatch.setenv("FASTPATH_ADMIN_KEY", KEY)  # the probe and `fastpath status` read the key from the environment
    probe = ["--check", "--http-port", str(server.options.http_port), "--server-pid", str(server.pid)]
    caplog.set_level(logging.INFO, logger="fastpath.server.stubs")
    thread = None
    try:
        page = skimage_path("page.png").read_bytes()
        page_boxes = detect_bytes(server, "http", [page])[0]
        assert len(page_boxes) == 5 and _probe(probe, capsys) == (0, "")
        supervisor.check()  # its first look (start() takes it too): every stub alive and answering
        stub = _stub(server)
        outcome: list[str] = []
        thread = _send_in_background(server, outcome)
        assert wait_for(lambda: getattr(stub_progress(stub), "in_flight", 0) == 1, timeout_s=30), stub_progress(stub)
        taken = stub_progress(stub)
        # two heartbeats later its execute() (milliseconds) has returned: the request waits in FastPath's scheduler
        assert wait_for(lambda: stub_progress(stub).heartbeat_s > taken.heartbeat_s + 1.5, timeout_s=30)
        os.kill(stub.pid, signal.SIGSTOP)

        # what Triton 2.51 does on its own: the model stays ready, the requests inside hang, new ones fail
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        assert client.is_model_ready(MODEL) and client.is_server_ready()
        with pytest.raises(InferenceServerException, match="is not healthy"):
            detect_bytes(server, "http", [page])
        assert wait_for(lambda: _probe(probe, capsys)[0] == 1, timeout_s=STALL_TIMEOUT_S + 30, poll_s=0.5)
        code, err = _probe(probe, capsys)
        assert code == 1 and re.fullmatch(rf"{MODEL} version 1 instance {stub.instance} \(stub pid {stub.pid}\) stopped "
                                          rf"answering: {STALLED}.*\n", err), err
        # The request inside is not answered. (Under a heavy load, a stop that lands before the stub's execute()
        # reply reached Triton makes Triton fail it like a new one: rare, also Triton's doing, not FastPath's.)
        assert outcome in ([], [f"[500] Stub process '{stub.instance}' is not healthy."]), outcome

        starting = threading.Thread(target=supervisor.start)  # its first look finds the stall and reloads the model
        starting.start()
        said: list[tuple[int, str]] = []  # `fastpath status` while the model is away: it says a reload is under way

        def reloaded() -> bool:
            capsys.readouterr()
            said.append((cli.main(["status", MODEL, "--url", server.http_url]), capsys.readouterr().err))
            return supervisor.reloaded == [MODEL]

        assert wait_for(reloaded, timeout_s=120, poll_s=0.1), supervisor.failure
        starting.join(timeout=30)
        assert any(code == 1 and f"{MODEL} at {server.http_url} is being reloaded: its python-backend stub (pid {stub.pid}) "
                   "stalled at" in err for code, err in said), said
        assert supervisor.failure is None
        logged = [r.getMessage() for r in caplog.records if r.name == "fastpath.server.stubs"]
        assert any(re.match(rf"model '{MODEL}' instance {stub.instance} \(stub pid {stub.pid}\) stopped answering: "
                            rf"{STALLED}.*killing it \(SIGKILL\)$", line) for line in logged), logged
        assert any(f"reloaded model '{MODEL}' after its stub stalled" in line for line in logged), logged

        np.testing.assert_array_equal(detect_bytes(server, "http", [page])[0], page_boxes)
        new = _stub(server)
        assert new.pid != stub.pid and new.instance == stub.instance
        assert wait_for(lambda: _probe(probe, capsys) == (0, ""), timeout_s=30, poll_s=0.5)
        assert server.is_ready()
        status = _status(server, capsys)
        (recovery,) = status["recoveries"]
        assert (recovery["cause"], recovery["outcome"], recovery["pid"], recovery["instance"]) == (
            "stalled", "reloaded", stub.pid, stub.instance)
        assert re.match(STALLED, recovery["detail"]), recovery
        assert (recovery["triton_version"], recovery["serving_version"]) == (stub.version, None)  # no live swaps here
        # the new stub's record, once a heartbeat (every second) has counted the one request it answered
        assert wait_for(lambda: [p["answered"] for p in _status(server, capsys)["progress"].values()] == [1], timeout_s=30)
        (progress,) = _status(server, capsys)["progress"].values()
        assert progress["pid"] == new.pid and progress["stalled"] is None
        assert progress["in_flight"] == 0 and progress["accepted"] == progress["answered"] == 1
    finally:
        supervisor.stop()
        server.stop()
        if thread is not None:
            thread.join(timeout=30)
