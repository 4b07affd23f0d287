"""A crashed tritonserver leaves nothing behind: its orphaned python-backend stubs are killed and
its shared-memory regions removed when FastPath stops it (a >4 MB JSON body segfaults Triton 2.51's
HTTP frontend, upstream triton-inference-server/server#5840)."""

import os
import signal
import time
from pathlib import Path

from fastpath.server.cleanup import mapped_regions
from fastpath.server.process import SHM_GLOB, group_members
from tests.conftest import start_server


def test_a_segfaulted_server_leaves_no_stub_and_no_shared_memory(tmp_path):
    before = set(Path("/dev/shm").glob(SHM_GLOB))
    server = start_server(tmp_path, models=("fastpath_admin",))
    pid = server.pid
    stubs = [p for p in group_members(pid) if p != pid]
    assert stubs, "the python-backend stub runs in tritonserver's process group"
    # this server's regions: new since the start and mapped by its group (another server on the host, e.g. one
    # still stopping after an earlier test, may create regions meanwhile; they are not this server's to remove)
    ours = {Path(p) for p in mapped_regions(group_members(pid))} & (set(Path("/dev/shm").glob(SHM_GLOB)) - before)
    assert ours, "the python backend mapped its shared-memory region"
    os.kill(pid, signal.SIGSEGV)  # what the oversized JSON body does
    deadline = time.monotonic() + 30
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.poll() == -signal.SIGSEGV
    assert [p for p in stubs if Path(f"/proc/{p}").exists()], "without the reaper the stubs outlive the crash"
    server.stop()
    assert not set(stubs) & set(group_members(pid))
    assert not (ours & set(Path("/dev/shm").glob(SHM_GLOB)))
