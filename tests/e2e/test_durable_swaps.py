"""A live swap survives what Triton does next: a reload through its repository API, a restart, a
reload that races the swap, and a corrupt or damaged serving-version record (fastpath.swaps.record)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, wait_for
from tests.e2e.swap_support import MODELS, admin, make_swap_repository

pytestmark = pytest.mark.e2e
KEY = "durable-swap-admin-key"
MODEL = "text_embedding"
V2 = MODELS / MODEL / "2"
HEADERS = {"fastpath-admin-key": KEY}


@pytest.fixture
def repository(tmp_path):
    versions = {1: MODELS / MODEL / "1", 2: V2 if (V2 / "manifest.json").exists() else MODELS / MODEL / "1"}
    return make_swap_repository(tmp_path, versions)


def _swap(server, version, command="swap"):
    return admin(server.http_url, {"command": command, "model": MODEL, "version": version, "key": KEY})


def _status(server):
    return admin(server.http_url, {"command": "status", "model": MODEL})


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`fastpath ARGS` with the admin key, as a user runs it."""
    env = dict(os.environ, FASTPATH_ADMIN_KEY=KEY)
    return subprocess.run([sys.executable, "-m", "fastpath", *args], env=env, capture_output=True, text=True, timeout=120)


def _served_versions(server) -> set[int]:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("TEXT", [3, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a short one"], [b"durable versions " * 20], [b""]], dtype=object))
    result = client.infer(MODEL, [tensor], outputs=[httpclient.InferRequestedOutput("MODEL_VERSION")])
    return set(result.as_numpy("MODEL_VERSION").reshape(-1).tolist())


def _reload_with_override(server, delay_us: int) -> None:
    """What an operator changing one setting does: Triton's repository API load with a config override.
    Returns once the reloaded instance serves and the replaced one has left the control plane."""
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config(MODEL)
    config["parameters"]["max_queue_delay_us"] = {"string_value": str(delay_us)}
    client.load_model(MODEL, headers=HEADERS, config=json.dumps(config))
    assert wait_for(lambda: len(_status(server)["instances"]) == 1, 60), _status(server)


def test_a_reload_with_a_config_override_keeps_the_swapped_version(tmp_path, repository):
    """swap -> Triton reload (config override) -> still version 2, and status says how it got there."""
    server = start_server(tmp_path, repository=repository, admin_key=KEY, version_state_dir=tmp_path / "versions")
    try:
        assert _swap(server, 2)["active_version"] == 2
        _reload_with_override(server, 2001)
        status = _status(server)
        assert status["active_version"] == 2 and _served_versions(server) == {2}
        instance = next(iter(status["instances"].values()))
        assert instance["restore"] == {"version": 2, "ok": True, "error": None}
        assert instance["serving_reason"] == "swap" and instance["previous_version"] == 1
        assert status["recorded"]["version"] == 2 and status["recorded"]["previous_version"] == 1
    finally:
        server.stop()


def test_a_restart_comes_back_on_the_swapped_version_and_can_roll_back(tmp_path, repository):
    """swap -> server restart -> still version 2, and Triton's log says so at its default verbosity; rollback then
    returns to 1 from the record."""
    versions = tmp_path / "versions"
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    server = start_server(tmp_path / "first", repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        assert _swap(server, 2)["active_version"] == 2
    finally:
        server.stop()
    server = start_server(tmp_path / "second", repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        assert _status(server)["active_version"] == 2 and _served_versions(server) == {2}
        assert f"{MODEL}: serving version 2 from {versions / MODEL}.json (swap at" in (tmp_path / "second" / "tritonserver.log").read_text()
        rolled = admin(server.http_url, {"command": "rollback", "model": MODEL, "key": KEY})
        assert rolled["active_version"] == 1 and _served_versions(server) == {1}
        assert json.loads((versions / f"{MODEL}.json").read_text())["reason"] == "rollback"
    finally:
        server.stop()


def test_a_reload_racing_a_swap_never_leaves_a_version_other_than_the_one_reported(tmp_path, repository):
    """20 times: a swap, and a reload landing 0-1.5 s into it. Invariant: afterwards the rows served,
    status and (when the swap succeeded) its reply all name one version."""
    server = start_server(tmp_path, repository=repository, admin_key=KEY, version_state_dir=tmp_path / "versions")
    rng = random.Random(20261201)
    outcomes = []
    try:
        for attempt in range(20):
            target = 2 if attempt % 2 == 0 else 1
            reply: dict = {}

            def swap(target=target, reply=reply):
                try:
                    reply["ok"] = _swap(server, target)
                except Exception as exc:  # a swap may fail when its instance is unloaded; it must say so
                    reply["error"] = str(exc)

            thread = threading.Thread(target=swap)
            thread.start()
            threading.Event().wait(rng.uniform(0.0, 1.5))
            _reload_with_override(server, 2000 + attempt)
            thread.join(180)
            assert not thread.is_alive()
            status = _status(server)
            served = _served_versions(server)
            assert status["active_versions"] == sorted(served) and len(served) == 1, (attempt, status, served)
            if "ok" in reply:
                assert reply["ok"]["active_version"] == status["active_version"], (attempt, reply, status)
            outcomes.append((target, status["active_version"], "ok" in reply))
        # the swaps that reported success ended on their target
        assert all(final == target for target, final, ok in outcomes if ok), outcomes
    finally:
        server.stop()


def test_a_corrupt_record_is_logged_and_reported_never_a_silent_revert(tmp_path, repository):
    """A record that is not JSON: the model loads on Triton's version, the log names the file, status
    reports the error; the next swap rewrites the record."""
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / f"{MODEL}.json").write_text('{"version": 2, "previous_')  # cut short
    server = start_server(tmp_path, repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        status = _status(server)
        instance = next(iter(status["instances"].values()))
        assert status["active_version"] == 1 and instance["restore"]["ok"] is False
        assert str(versions / f"{MODEL}.json") in instance["restore"]["error"]
        assert "error" in status["recorded"]
        log = (tmp_path / "tritonserver.log").read_text()
        assert f"record unreadable: {versions / MODEL}.json: is not a JSON record" in log and "serving the version Triton loaded" in log
        assert _swap(server, 2)["active_version"] == 2
        assert json.loads((versions / f"{MODEL}.json").read_text())["version"] == 2
    finally:
        server.stop()


DAMAGED = {
    "random bytes": (random.Random(15).randbytes(4096), "is not UTF-8 text"),
    "nesting above the size limit": (b"[" * 200_000 + b"]" * 200_000, "is larger than 65536 bytes"),
    "nesting within the size limit": (b"[" * 30_000 + b"]" * 30_000, "is not a JSON record: nested too deeply to parse"),
}


@pytest.mark.parametrize("kind", list(DAMAGED))
def test_a_damaged_record_never_stops_the_server_and_status_and_rollback_answer(tmp_path, repository, monkeypatch, kind):
    """Under the C locale (ASCII): with a damaged record the server starts on Triton's version; status shows
    'record unreadable: <file>: <problem>'; rollback answers (400, naming the problem, while there is
    nothing to roll back to; after a swap and the file damaged again on the live server, back to 1)."""
    data, problem = DAMAGED[kind]
    monkeypatch.setenv("LC_ALL", "C")
    versions = tmp_path / "versions"
    versions.mkdir()
    record = versions / f"{MODEL}.json"
    record.write_bytes(data)
    server = start_server(tmp_path, repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        status = _status(server)
        unreadable = f"record unreadable: {record}: {problem}"
        instance = next(iter(status["instances"].values()))
        assert status["active_version"] == 1 and _served_versions(server) == {1}
        assert instance["restore"]["ok"] is False and instance["restore"]["error"].startswith(unreadable)
        assert status["recorded"]["error"].startswith(unreadable)
        assert unreadable in (tmp_path / "tritonserver.log").read_text()
        with pytest.raises(InferenceServerException, match=f"nothing to roll back to.*{re.escape(unreadable)}") as refused:
            admin(server.http_url, {"command": "rollback", "model": MODEL, "key": KEY})
        assert refused.value.status() == "400"
        shown = _cli("status", MODEL, "--url", server.http_url)  # what an operator types
        assert shown.returncode == 0 and json.loads(shown.stdout)["recorded"]["error"].startswith(unreadable), shown.stderr
        refused_cli = _cli("rollback", MODEL, "--url", server.http_url)
        assert refused_cli.returncode == 1 and "nothing to roll back to" in refused_cli.stderr and unreadable in refused_cli.stderr
        assert _swap(server, 2)["active_version"] == 2
        record.write_bytes(data)  # damaged again while the server runs
        assert _status(server)["recorded"]["error"].startswith(unreadable)
        rolled = admin(server.http_url, {"command": "rollback", "model": MODEL, "key": KEY})
        assert rolled["active_version"] == 1 and _served_versions(server) == {1}
        assert json.loads(record.read_text())["reason"] == "rollback"
    finally:
        server.stop()


def test_a_utf8_record_is_read_as_utf8_under_an_ascii_locale(tmp_path, repository, monkeypatch):
    """A valid record holding UTF-8 text restores its version at start under the C locale (ASCII), and
    status shows the text as written; rollback returns to the recorded previous version."""
    monkeypatch.setenv("LC_ALL", "C")
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / f"{MODEL}.json").write_bytes(b'{"version": 2, "previous_version": 1, "reason": "swap \xc3\xa9"}')
    server = start_server(tmp_path, repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        status = _status(server)
        instance = next(iter(status["instances"].values()))
        assert status["active_version"] == 2 and _served_versions(server) == {2}
        assert instance["restore"] == {"version": 2, "ok": True, "error": None}
        assert instance["serving_reason"] == "swap \u00e9" and status["recorded"]["reason"] == "swap \u00e9"
        rolled = admin(server.http_url, {"command": "rollback", "model": MODEL, "key": KEY})
        assert rolled["active_version"] == 1 and _served_versions(server) == {1}
    finally:
        server.stop()


def test_a_dangling_record_link_in_the_model_directory_never_stops_the_server(tmp_path, repository, caplog):
    """Triton's poll of a model directory fails on a link to nothing ("failed to stat file") and the model would
    not load. A serving_version.json link to nothing is a damaged record: the start removes it, says so, and
    the server serves its loaded version and swaps as usual."""
    link = repository / MODEL / "serving_version.json"
    link.symlink_to(tmp_path / "nowhere" / "serving_version.json")
    with caplog.at_level("WARNING", logger="fastpath"):
        server = start_server(tmp_path, repository=repository, admin_key=KEY)
    try:
        assert not link.is_symlink() and _served_versions(server) == {1}
        assert any(f"removed {link}: a symbolic link to {tmp_path / 'nowhere' / 'serving_version.json'}" in r.getMessage()
                   for r in caplog.records)
        assert _swap(server, 2)["active_version"] == 2
    finally:
        server.stop()


def test_a_swap_to_the_version_already_serving_rewrites_a_record_that_names_a_lost_one(tmp_path):
    """Versions 1-3; swaps to 2 then 3; version 3 is deleted and the server restarts: it serves 2, the previous
    version in the record, says so in Triton's log, and reports no previous version (the record's previous, 2,
    is the one serving). A swap to 2 then changes no engine but rewrites the record, so once version 3 is back
    a restart still serves 2. Invariant: after a successful swap to V, a reload or restart serves V."""
    import shutil

    v1 = MODELS / MODEL / "1"
    repository = make_swap_repository(tmp_path, {1: v1, 2: V2 if (V2 / "manifest.json").exists() else v1, 3: v1})
    versions, record = tmp_path / "versions", tmp_path / "versions" / f"{MODEL}.json"
    for run in ("first", "second", "third"):
        (tmp_path / run).mkdir()
    server = start_server(tmp_path / "first", repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        assert _swap(server, 2)["active_version"] == 2 and _swap(server, 3)["active_version"] == 3
    finally:
        server.stop()
    aside = tmp_path / "version-3-aside"
    shutil.move(repository / MODEL / "3", aside)
    server = start_server(tmp_path / "second", repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        status = _status(server)
        (instance,) = status["instances"].values()
        assert status["active_version"] == 2 and _served_versions(server) == {2}
        assert instance["restore"]["version"] == 2 and instance["restore"]["ok"] is False
        assert instance["previous_version"] is None, instance
        assert (f"{MODEL}: serving version 2, the previous version in {record}, instead of version 3 (swap at"
                in (tmp_path / "second" / "tritonserver.log").read_text())
        assert json.loads(record.read_text())["version"] == 3  # a restore does not rewrite the record
        assert _swap(server, 2)["active_version"] == 2
        assert json.loads(record.read_text())["version"] == 2
    finally:
        server.stop()
    shutil.move(aside, repository / MODEL / "3")
    server = start_server(tmp_path / "third", repository=repository, admin_key=KEY, version_state_dir=versions)
    try:
        assert _status(server)["active_version"] == 2 and _served_versions(server) == {2}
    finally:
        server.stop()
