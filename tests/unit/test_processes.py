"""fastpath.processes.process_running: the liveness check behind every cleanup of what a gone process left."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastpath.processes import process_running


def test_a_running_process_runs_and_a_reaped_one_does_not():
    """Invariant: this process runs; a child that exited and was reaped does not (its pid names no process)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_running(os.getpid())
    assert not process_running(child.pid)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="zombie state is read from /proc (Linux)")
def test_a_zombie_does_not_run():
    """Invariant: a child that exited but is not reaped yet (state Z, as a killed stub under tritonserver) does not run,
    although kill(pid, 0) still succeeds on it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    os.kill(child.pid, 0)  # succeeds: the pid still names the zombie
    assert not process_running(child.pid)
    child.wait()
