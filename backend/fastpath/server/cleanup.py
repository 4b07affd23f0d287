"""Cleaning up after tritonserver: its process group (the python-backend stubs) and the shared-memory
regions the python backend leaves in ``/dev/shm`` when the server dies without unloading.

Used by :class:`fastpath.server.process.TritonServer` (after every stop, and before every start for what a
killed ``fastpath serve`` could not clean) and by the stub supervisor (:mod:`fastpath.server.stubs`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

from fastpath.processes import process_running

LOG = logging.getLogger("fastpath.server.process")
SHM_GLOB = "triton_python_backend_shm_region_*"  # the python backend's shared-memory regions in /dev/shm
STATE_PREFIX = "fastpath-state-"  # a server's own control-plane directory in the temporary folder
OWNER_NAME = "owner.pid"  # in such a directory: the pid of the process that made it


def _mapped_paths(pids: list[int] | None = None) -> set[str]:
    """Paths of /dev/shm files mapped by the processes ``pids`` (/proc/PID/maps), or by any process we can see."""
    files = [Path(f"/proc/{pid}/maps") for pid in pids] if pids is not None else Path("/proc").glob("[0-9]*/maps")
    paths: set[str] = set()
    for maps in files:
        try:
            text = maps.read_text()
        except OSError:
            continue
        paths.update(line.split(None, 5)[5] for line in text.splitlines() if line.count(" ") >= 5 and "/dev/shm/" in line)
    return paths


def mapped_regions(pids: list[int]) -> set[str]:
    """The python-backend shared-memory regions (:data:`SHM_GLOB` in /dev/shm) that the processes ``pids`` map."""
    return {path.removesuffix(" (deleted)") for path in _mapped_paths(pids) if Path(path).match(SHM_GLOB)}


def reap_process_group(pgid: int, shm_before: set[str], owned: set[str] | frozenset[str] = frozenset()) -> tuple[int, list[str]]:
    """After tritonserver (group leader ``pgid``) exited: SIGKILL what is left of its group (stubs
    orphaned by a crash), then unlink the python-backend shared-memory regions that were this server's (in
    ``owned``, or mapped by a member of the group now), appeared since ``shm_before``, and that no live process
    maps any more. Another server's region on the same host is never touched, even one it has created and not
    mapped yet. Returns (processes signalled, files removed)."""
    members = group_members(pgid)
    signalled = len(members)
    owned = set(owned) | mapped_regions(members)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5.0
    while members and time.monotonic() < deadline:
        members = [pid for pid in members if _pgid_of(pid) == pgid]
        time.sleep(0.05)
    leftover = {str(p) for p in Path("/dev/shm").glob(SHM_GLOB)} - shm_before if Path("/dev/shm").is_dir() else set()
    return signalled, _unlink_unmapped(leftover & owned)


def _unlink_unmapped(paths: set[str] | list[str]) -> list[str]:
    """Unlink the ``paths`` no live process maps; returns those removed, sorted."""
    if not paths:
        return []
    mapped = _mapped_paths()
    removed = []
    for path in sorted(set(paths) - mapped):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


# A region this old that no process maps is left over. The python backend maps a region in the call that creates
# it (shm_open, truncate, mmap), so only a region made in the last moment may be unmapped and still a live server's;
# 60 s left the regions of a server killed with `fastpath serve` in place when it was started again within a minute.
STALE_SHM_AGE_S = 5.0


def remove_stale_shm(min_age_s: float = STALE_SHM_AGE_S) -> list[str]:
    """Unlink this user's python-backend shared-memory regions that no live process maps and that are
    older than ``min_age_s``: what a tritonserver left when it and ``fastpath serve`` were both killed (``kill -9``
    of ``fastpath serve``: Triton dies with it, nobody is left to clean).
    Returns the paths removed."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return []
    now, uid = time.time(), os.getuid()
    candidates = []
    for path in shm.glob(SHM_GLOB):
        try:
            info = path.stat()
            # only our own: another user's server may map a region where /proc does not show it to us
            if info.st_uid == uid and now - info.st_mtime >= min_age_s:
                candidates.append(str(path))
        except OSError:
            continue
    return _unlink_unmapped(candidates)


def group_members(pgid: int) -> list[int]:
    """PIDs of the live processes in process group ``pgid`` (e.g. a tritonserver's stubs)."""
    return [int(d.name) for d in Path("/proc").glob("[0-9]*") if _pgid_of(int(d.name)) == pgid]


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def make_state_dir() -> Path:
    """A fresh control-plane directory in the temporary folder, naming this process as its maker."""
    path = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
    (path / OWNER_NAME).write_text(f"{os.getpid()}\n")
    return path


# A state directory gets its owner file right after mkdtemp; one still without it after this long lost its maker in
# between (or was made by a release before owner files), so nobody else will remove it.
UNOWNED_STATE_AGE_S = 60.0


def remove_orphaned_state_dirs(unowned_age_s: float = UNOWNED_STATE_AGE_S) -> list[Path]:
    """Remove this user's :func:`make_state_dir` directories whose maker no longer runs (a ``fastpath serve`` killed
    with SIGKILL cannot remove its own), and those without an owner file older than ``unowned_age_s`` seconds;
    another user's, or a young one without an owner file (its maker may be about to write it), is left alone.
    Returns the directories removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(STATE_PREFIX + "*"):
        try:
            info = path.stat()
            if info.st_uid != os.getuid() or not stat.S_ISDIR(info.st_mode):
                continue
            try:
                orphaned = not process_running(int((path / OWNER_NAME).read_text()))
            except FileNotFoundError:
                orphaned = time.time() - info.st_mtime >= unowned_age_s
        except (OSError, ValueError):
            continue
        if orphaned:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


STUB_NAME = "triton_python_backend_stub"


def kill_orphaned_stubs() -> list[int]:
    """SIGKILL this user's python-backend stubs whose tritonserver is gone (their parent is no longer a tritonserver):
    a ``fastpath serve`` killed while its models load leaves them before their watchdog runs, ignoring SIGTERM and
    holding their shared-memory regions. Returns the pids signalled."""
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid != os.getuid() or not (proc / "cmdline").read_bytes().split(b"\0")[0].endswith(STUB_NAME.encode()):
                continue
            state, ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            parent = Path(f"/proc/{ppid}/comm").read_text().strip() if int(ppid) > 1 else ""
        except (OSError, ValueError):
            continue
        if parent != "tritonserver" and state not in ("Z", "X"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def clean_after_killed_servers() -> None:
    """Before a start: remove what servers killed with their ``fastpath serve`` left, and log it: their stubs
    (:func:`kill_orphaned_stubs`), shared-memory regions (:func:`remove_stale_shm`) and state directories
    (:func:`remove_orphaned_state_dirs`)."""
    stubs = kill_orphaned_stubs()
    if stubs:
        LOG.info("killed %d python-backend stubs whose tritonserver was gone: pids %s", len(stubs), ", ".join(map(str, stubs)))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}/maps").exists() for pid in stubs):
            time.sleep(0.05)  # their regions count as mapped until they have exited
    orphaned = remove_orphaned_state_dirs()
    if orphaned:
        LOG.info("removed %d state directories of servers killed before they could: %s", len(orphaned),
                 ", ".join(str(path) for path in orphaned))
    stale = remove_stale_shm()
    if stale:
        LOG.info("removed %d shared-memory regions left by an earlier tritonserver that was killed: %s",
                 len(stale), ", ".join(Path(path).name for path in stale))
