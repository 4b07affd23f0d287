"""Shared-memory cleanup on real /dev/shm files: remove_stale_shm (regions left by a killed server) and
reap_process_group (a crashed server's own regions only)."""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import uuid
from pathlib import Path

import pytest

from fastpath.server.cleanup import SHM_GLOB, reap_process_group, remove_stale_shm

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")


def _region(age_s: float) -> Path:
    path = Path("/dev/shm") / SHM_GLOB.replace("*", f"test-{uuid.uuid4()}")
    path.write_bytes(b"\0" * 4096)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


def test_only_regions_older_than_a_few_seconds_that_no_process_maps_are_removed():
    """Invariant: a start removes the regions of a server killed 10 s before (a quick restart after kill -9), and
    keeps a region made this instant (a server starting beside it) and any region a live process maps."""
    stale, fresh, mapped = _region(10), _region(0), _region(3600)
    with open(mapped, "r+b") as handle, mmap.mmap(handle.fileno(), 4096) as _view:  # a live server's region
        try:
            removed = remove_stale_shm()
            assert str(stale) in removed and not stale.exists()
            assert fresh.exists() and mapped.exists()  # too new (a server starting now), and mapped
        finally:
            for path in (stale, fresh, mapped):
                path.unlink(missing_ok=True)


def test_reaping_a_group_removes_its_own_regions_and_never_another_servers():
    """Invariant: after a crash, reap_process_group kills the group and unlinks the new unmapped regions that a
    member of the group mapped (its own), while a region another server created on the same host and has not
    mapped yet (new since the start too, unmapped) stays."""
    import subprocess
    import sys

    before = {str(p) for p in Path("/dev/shm").glob(SHM_GLOB)}
    own, foreign = _region(0), _region(0)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import mmap, sys, time\n"
        f"handle = open({str(own)!r}, 'r+b'); view = mmap.mmap(handle.fileno(), 4096)\n"
        "print('mapped', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        signalled, removed = reap_process_group(holder.pid, before)
        assert signalled == 1 and holder.wait(timeout=10) == -9
        assert removed == [str(own)] and not own.exists()
        assert foreign.exists(), "another server's region is not this group's to remove"
    finally:
        holder.kill()
        for path in (own, foreign):
            path.unlink(missing_ok=True)


def test_state_directories_of_dead_makers_are_removed_and_others_kept(tmp_path, monkeypatch):
    """Invariant: a start removes the temporary state directory of a `fastpath serve` killed with SIGKILL (its maker's
    pid no longer runs) and one without an owner file older than a minute (its maker died before writing it), and
    keeps one whose maker runs, a young one without an owner file, and anything else in the folder."""
    import subprocess
    import sys
    import tempfile

    from fastpath.server.cleanup import OWNER_NAME, make_state_dir, remove_orphaned_state_dirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphaned, live, unowned, old_unowned = make_state_dir(), make_state_dir(), make_state_dir(), make_state_dir()
    (orphaned / OWNER_NAME).write_text(f"{dead.pid}\n")
    (unowned / OWNER_NAME).unlink()
    (old_unowned / OWNER_NAME).unlink()
    minute_ago = time.time() - 61
    os.utime(old_unowned, (minute_ago, minute_ago))
    (tmp_path / "fastpath-statement.txt").write_text("not a directory of ours")
    assert live.parent == tmp_path and (live / OWNER_NAME).read_text().strip() == str(os.getpid())
    assert sorted(remove_orphaned_state_dirs()) == sorted([orphaned, old_unowned])
    assert not orphaned.exists() and not old_unowned.exists()
    assert live.is_dir() and unowned.is_dir() and (tmp_path / "fastpath-statement.txt").exists()


def test_stubs_whose_tritonserver_is_gone_are_killed_and_live_servers_stubs_kept(tmp_path):
    """Invariant: a start SIGKILLs this user's processes named triton_python_backend_stub whose parent is not a
    tritonserver (orphans of a server killed while its models loaded: they ignored SIGTERM and held their regions
    for good) and leaves a stub whose parent is a tritonserver alone."""
    import shutil
    import signal
    import subprocess
    import time

    from fastpath.server.cleanup import STUB_NAME, kill_orphaned_stubs

    stub, server = tmp_path / STUB_NAME, tmp_path / "tritonserver"
    shutil.copy(shutil.which("sleep"), stub)
    shutil.copy(shutil.which("sh"), server)
    orphan = int(subprocess.run(["sh", "-c", f"{stub} 60 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                                check=True).stdout)  # its shell exits: the stub is reparented away from it
    parent = subprocess.Popen([str(server), "-c", f"{stub} 60; :"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (child := [p for p in Path("/proc").glob("[0-9]*") if _parent_of(p) == parent.pid]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert child, "the tritonserver-named shell started no stub"
        killed = kill_orphaned_stubs()
        assert orphan in killed and int(child[0].name) not in killed
        assert _gone(orphan, timeout_s=5) and Path(f"/proc/{child[0].name}").exists()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)


def _parent_of(proc: Path) -> int | None:
    try:
        return int(proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False
