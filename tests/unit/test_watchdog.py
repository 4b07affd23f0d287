"""fastpath.triton.watchdog: a stub whose server dies is killed; a stub that exits leaves no watcher."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import process_alive as _alive
from tests.conftest import wait_for as _wait

# A "stub": starts its watchdog and then, like a stub blocked on a dead server with the GIL held,
# never looks up again. A "server": starts the stub and prints both pids.
STUB = "import time; from fastpath.triton.watchdog import exit_with_server; print(exit_with_server().pid, flush=True); time.sleep(3600)"
SERVER = (
    "import subprocess, sys, time\n"
    "stub = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE, text=True)\n"
    "print(stub.pid, stub.stdout.readline().strip(), flush=True)\n"
    "time.sleep(3600)\n"
)


def test_a_stub_whose_server_is_killed_is_killed_and_its_watcher_exits():
    server = subprocess.Popen([sys.executable, "-c", SERVER, STUB], stdout=subprocess.PIPE, text=True)
    stub, watcher = (int(x) for x in server.stdout.readline().split())
    assert _alive(stub) and _alive(watcher)
    time.sleep(1.5)
    assert _alive(stub), "the watchdog leaves a stub alone while its server lives"
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert _wait(lambda: not _alive(stub), 10), "the orphaned stub was not killed"
    assert _wait(lambda: not _alive(watcher), 10)


def test_the_watcher_ends_with_a_stub_that_exits_normally():
    code = "from fastpath.triton.watchdog import exit_with_server; print(exit_with_server().pid, flush=True)"
    stub = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    watcher = int(stub.stdout.strip())
    assert _wait(lambda: not _alive(watcher), 10)


def test_the_watcher_ends_with_a_killed_stub_its_server_never_reaps():
    """Triton 2.51 never reaps a python-backend stub killed under it: the stub stays a zombie (state Z) whose
    /proc stat still names the server as its parent. Invariant: the watcher ends anyway (it looped once a second
    until the server stopped), and the server is left alone."""
    server = subprocess.Popen([sys.executable, "-c", SERVER, STUB], stdout=subprocess.PIPE, text=True)
    try:
        stub, watcher = (int(x) for x in server.stdout.readline().split())
        assert _alive(watcher)
        os.kill(stub, signal.SIGKILL)
        assert _wait(lambda: _state(stub) == "Z", 10), "the killed stub should stay a zombie: its server never waits for it"
        assert _wait(lambda: not _alive(watcher), 10), "the watcher of a zombie stub kept running"
        assert server.poll() is None
    finally:
        server.kill()
        server.wait()


def _state(pid: int) -> str:
    """The state letter of process ``pid`` (field 3 of /proc/<pid>/stat), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return ""
