"""`fastpath serve` (what `make serve` runs): ports from the environment, clean stop, dies-with-parent."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import free_ports

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _start_serve(tmp_path):
    http_port, grpc_port, metrics_port = free_ports(3)
    env = dict(os.environ, HTTP_PORT=str(http_port), GRPC_PORT=str(grpc_port), METRICS_PORT=str(metrics_port))
    log = open(tmp_path / "serve.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "fastpath", "serve", "--host", "127.0.0.1"], env=env, stdout=log, stderr=subprocess.STDOUT)

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
    process, triton_pid, log = _start_serve(tmp_path)
    process.send_signal(signum)
    assert process.wait(timeout=60) == 0
    assert not _alive(triton_pid)
    text = log.read_text()
    assert f"received {signal.Signals(signum).name}" in text and "successfully unloaded 'text_embedding'" in text
    # The stubs shut down without a crash: pb_utils metrics left to the interpreter's exit made every
    # unload end in "Fatal Python error: Segmentation fault" (faulthandler prints it into this log).
    assert "Fatal Python error" not in text and "Segmentation fault" not in text, text[-3000:]


def test_triton_dies_with_its_parent(tmp_path):
    process, triton_pid, _ = _start_serve(tmp_path)
    process.kill()
    process.wait(timeout=10)
    assert _wait(lambda: not _alive(triton_pid), 30)
