"""`fastpath serve` (what `make serve` runs): ports from the environment, clean stop, dies-with-parent,
and `make serve` itself stopped by SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fastpath.server.process import group_members
from tests.conftest import REPO_ROOT, free_ports
from tests.conftest import process_alive as _alive
from tests.conftest import wait_for as _wait

pytestmark = pytest.mark.e2e


def _serve_env(tmp_path, ports) -> dict[str, str]:
    """The environment of a `fastpath serve` on ``ports`` with its own HOME (where it writes a generated admin key)."""
    env = {k: v for k, v in os.environ.items() if k != "FASTPATH_ADMIN_KEY"}
    (tmp_path / "home").mkdir(exist_ok=True)
    return dict(env, HOME=str(tmp_path / "home"), HTTP_PORT=str(ports[0]), GRPC_PORT=str(ports[1]), METRICS_PORT=str(ports[2]))


def _start_serve(tmp_path, ports=None, args=()):
    http_port, grpc_port, metrics_port = ports or free_ports(3)
    env = _serve_env(tmp_path, (http_port, grpc_port, metrics_port))
    log = open(tmp_path / "serve.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "fastpath", "serve", "--host", "127.0.0.1", *args], env=env, stdout=log,
                               stderr=subprocess.STDOUT)

    def ready():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/text_embedding/ready", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    assert _wait(ready, 180), (tmp_path / "serve.log").read_text()[-3000:]
    assert _wait(lambda: "fastpath INFO ready:" in (tmp_path / "serve.log").read_text(), 10)
    text = (tmp_path / "serve.log").read_text()
    triton_pid = int(re.search(r"tritonserver pid (\d+)", text).group(1))
    assert f"HTTP http://127.0.0.1:{http_port}" in text and f"127.0.0.1:{grpc_port}" in text and f":{metrics_port}/metrics" in text
    return process, triton_pid, tmp_path / "serve.log"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_triton_cleanly(tmp_path, signum):
    """`fastpath serve` with no --model serves every model of the repository; SIGINT/SIGTERM stop it with exit 0."""
    process, triton_pid, log = _start_serve(tmp_path)
    port = int(re.search(r"HTTP http://127.0.0.1:(\d+)", log.read_text()).group(1))
    for model in ("text_detection", "fastpath_admin"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/ready", timeout=5) as reply:
            assert reply.status == 200, model
    process.send_signal(signum)
    assert process.wait(timeout=60) == 0
    assert not _alive(triton_pid)
    text = log.read_text()
    assert f"received {signal.Signals(signum).name}" in text and "successfully unloaded 'text_embedding'" in text
    assert not list((tmp_path / "home" / ".cache" / "fastpath").glob("admin_key*"))  # the generated key left with the server
    # The stubs shut down without a crash: pb_utils metrics left to the interpreter's exit made every
    # unload end in "Fatal Python error: Segmentation fault" (faulthandler prints it into this log).
    assert "Fatal Python error" not in text and "Segmentation fault" not in text, text[-3000:]


def test_sigterm_while_the_models_load_stops_with_exit_0_and_leaves_nothing_behind(tmp_path):
    """Invariant: SIGTERM before the models are ready (an orchestrator giving up on a slow start) ends `fastpath serve`
    with exit 0, like a stop after ready: Triton, which dies of the SIGINT it has no handler for yet, and every stub
    are gone, and no shared-memory region of theirs is left (it exited 254 from Triton's -2), and the log warns of nothing."""
    env = _serve_env(tmp_path, free_ports(3))
    before = set(Path("/dev/shm").glob("triton_python_backend_shm_region_*"))
    with open(tmp_path / "serve.log", "w+") as log:
        process = subprocess.Popen([sys.executable, "-m", "fastpath", "serve", "--host", "127.0.0.1"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
        assert _wait(lambda: "tritonserver pid" in (tmp_path / "serve.log").read_text(), 60)
        triton_pid = int(re.search(r"tritonserver pid (\d+)", (tmp_path / "serve.log").read_text()).group(1))
        time.sleep(1.0)  # its python-backend stubs are starting
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    text = (tmp_path / "serve.log").read_text()
    assert "received SIGTERM" in text and "fastpath INFO ready:" not in text, text[-3000:]
    assert "tritonserver was stopped while it loaded its models" in text, text[-3000:]
    assert " WARNING " not in text and " ERROR " not in text, text[-3000:]  # the stubs it was starting are expected cleanup
    assert not _alive(triton_pid)
    assert set(Path("/dev/shm").glob("triton_python_backend_shm_region_*")) <= before


def test_a_stop_with_an_idle_keep_alive_client_still_drains_the_models_and_is_quick(tmp_path):
    """Triton 2.51 waits out its exit timeout (30 s) for open HTTP connections before it stops the
    models, so an idle client would make Ctrl-C take 32 s and end in a SIGKILL with the models never
    unloaded. `fastpath serve` unloads them first (fastpath.server.process.TritonServer.stop)."""
    process, triton_pid, log = _start_serve(tmp_path)
    port = int(re.search(r"HTTP http://127.0.0.1:(\d+)", log.read_text()).group(1))
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    idle.request("GET", "/v2/health/ready")  # keep-alive: the connection stays open
    assert idle.getresponse().read() == b""
    busy = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    texts = [" ".join(["drain"] * 200)] * 64
    busy.request("POST", "/v2/models/text_embedding/infer", json.dumps({"inputs": [
        {"name": "TEXT", "shape": [64, 1], "datatype": "BYTES", "data": texts}], "outputs": [{"name": "TOKEN_COUNT"}]}))
    time.sleep(0.05)  # the request is in, and runs for a while (64 texts of 200 words on 2 cores)
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    reply = json.loads(busy.getresponse().read())
    assert reply["outputs"][0]["data"] == [202] * 64  # answered in full while the server was stopping
    assert process.wait(timeout=60) == 0
    stop_s = time.monotonic() - started
    assert stop_s < 20, f"stopping took {stop_s:.1f} s"
    assert not _alive(triton_pid)
    text = log.read_text()
    assert "unloaded fastpath_admin, text_detection, text_embedding before stopping tritonserver" in text
    assert "successfully unloaded 'text_embedding'" in text and "exited with code -9" not in text
    idle.close()


def test_a_tritonserver_that_dies_is_restarted_up_to_max_restarts(tmp_path):
    """A crash in Triton itself (a segfault, as the requests in docs/known-issues.md cause) no longer ends the
    service: `fastpath serve` cleans up the dead server's stubs, starts a new tritonserver on the same ports and
    serves again. Past --max-restarts within 10 minutes it stops restarting and exits with the crash's code."""
    process, first_pid, log = _start_serve(tmp_path, args=("--model", "text_embedding", "--model", "fastpath_admin",
                                                           "--max-restarts", "1"))
    port = int(re.search(r"HTTP http://127.0.0.1:(\d+)", log.read_text()).group(1))
    stubs = [pid for pid in group_members(first_pid) if pid != first_pid]
    os.kill(first_pid, signal.SIGSEGV)

    def second_pid():
        pids = [int(p) for p in re.findall(r"tritonserver pid (\d+)", log.read_text())]
        return pids[1] if len(pids) > 1 and log.read_text().count("fastpath INFO ready:") > 1 else None

    assert _wait(second_pid, 180), log.read_text()[-3000:]
    restarted = second_pid()
    assert restarted != first_pid and process.poll() is None
    text = log.read_text()
    assert "tritonserver died (exit code -11): restarting it (restart 1 of at most 1 in 600 s)" in text, text[-3000:]
    assert not any(_alive(pid) for pid in stubs)  # the dead server's stubs were cleaned up before the restart
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hello again"]}]})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/text_embedding/infer", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200 and len(json.loads(reply.read())["outputs"][0]["data"]) == 384
    os.kill(restarted, signal.SIGSEGV)
    assert process.wait(timeout=60) == 256 - signal.SIGSEGV  # the crash's code -11, as an exit status
    assert "(--max-restarts 1): not restarting it" in log.read_text()
    assert not _alive(restarted)


def test_triton_and_its_stubs_die_with_their_parent(tmp_path):
    process, triton_pid, _ = _start_serve(tmp_path)
    stubs = [pid for pid in group_members(triton_pid) if pid != triton_pid]  # its python-backend stubs
    assert len(stubs) >= 3  # every model of the repository: text_embedding, text_detection and fastpath_admin
    process.kill()
    process.wait(timeout=10)
    assert _wait(lambda: not _alive(triton_pid), 30)
    # Triton 2.51's stubs outlive a killed server; FastPath's models exit theirs (fastpath.triton.watchdog).
    assert _wait(lambda: not any(_alive(pid) for pid in stubs), 30), [pid for pid in stubs if _alive(pid)]


def test_a_serve_that_cannot_start_leaves_the_running_servers_admin_key_alone(tmp_path):
    ports = free_ports(3)
    process, _, _ = _start_serve(tmp_path, ports)
    keys = tmp_path / "home" / ".cache" / "fastpath"
    try:
        key = (keys / f"admin_key.{ports[0]}").read_text()
        assert (keys / f"admin_key.{ports[1]}").read_text() == key == (keys / "admin_key").read_text()
        second = subprocess.run([sys.executable, "-m", "fastpath", "serve", "--host", "127.0.0.1"], env=_serve_env(tmp_path, ports),
                                capture_output=True, text=True, timeout=180)
        assert second.returncode != 0, second.stdout[-2000:] + second.stderr[-2000:]
        assert (keys / f"admin_key.{ports[0]}").read_text() == key == (keys / "admin_key").read_text()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def _port_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:``port`` (SO_REUSEADDR: a connection in TIME_WAIT does not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_sigterm_to_make_serve_stops_tritonserver_and_frees_every_port(tmp_path):
    """`make serve &` then `kill $!`: make forwards SIGTERM to its recipe, which must be `fastpath serve`
    itself (exec), not a shell that dies alone. Invariant: afterwards no process make started is left
    (fastpath serve, tritonserver, its stubs) and the HTTP, gRPC and metrics ports are all free."""
    env = {k: v for k, v in _serve_env(tmp_path, free_ports(3)).items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    if subprocess.run(["make", "-q", "-C", str(REPO_ROOT), "artifacts", "artifacts-int8"], env=env).returncode != 0:
        pytest.skip("the model artifacts are not built: `make serve` would build them first (make artifacts artifacts-int8)")
    ports = [int(env[name]) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")]
    args = [f"{name}={env[name]}" for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")]
    with open(tmp_path / "make.log", "w+") as log:
        make = subprocess.Popen(["make", "-C", str(REPO_ROOT), "serve", "HOST=127.0.0.1", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    started: list[int] = []
    try:
        assert _wait(lambda: "fastpath INFO ready:" in (tmp_path / "make.log").read_text(), 180), (tmp_path / "make.log").read_text()[-3000:]
        triton_pid = int(re.search(r"tritonserver pid (\d+)", (tmp_path / "make.log").read_text()).group(1))
        started = [pid for pid in group_members(make.pid) + group_members(triton_pid) if pid != make.pid]
        assert triton_pid in started and len(started) >= 5  # fastpath serve, tritonserver, a stub per model
        assert all(not _port_free(port) for port in ports)
        make.send_signal(signal.SIGTERM)
        make.wait(timeout=60)
        assert _wait(lambda: not any(_alive(pid) for pid in started), 30), [pid for pid in started if _alive(pid)]
        assert [port for port in ports if not _port_free(port)] == []
        text = (tmp_path / "make.log").read_text()
        assert "received SIGTERM: stopping tritonserver" in text and "tritonserver exited with code 0" in text, text[-3000:]
    finally:
        for pid in [make.pid, *started]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        make.wait(timeout=10)
