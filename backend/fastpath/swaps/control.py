"""The control plane between the admin model and the serving model instances.

Each python-backend model instance runs in its own stub process, and Triton offers no channel from
one model to another's running stub except inference. FastPath therefore keeps a small state
directory on the local filesystem (``FASTPATH_STATE_DIR``; ``fastpath serve`` makes a fresh one per
server):

    <state>/<model>/desired.json              the latest command: {"generation", "command", "version", ...}
    <state>/<model>/instances/<name>.json     each serving instance's status and process id, rewritten as a heartbeat
    <state>/<model>/recoveries.json           the stub supervisor's last reloads of the model, with their causes
    <state>/<model>/progress/<name>.<pid>     each scheduled instance's progress record (fastpath.triton.progress)

The admin model (``fastpath_admin``) writes ``desired.json`` atomically (temp file + rename, posts
serialized by a ``flock``) and waits
until every live instance reports that generation. Each serving instance's background thread
(:class:`~fastpath.swaps.agent.SwapAgent`) is woken by an inotify watch of ``<model>/`` (or polls
``desired.json``'s inode and mtime where inotify is unavailable) and applies the command to its
:class:`~fastpath.swaps.slots.EngineSlots`. No stub is respawned; nothing new listens on a port.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from fastpath.errors import SwapError
from fastpath.processes import process_running

HEARTBEAT_S = 1.0
STALE_AFTER_S = 30.0  # generous: on a saturated 2-core machine a heartbeat can lag seconds
RECOVERIES_KEPT = 10


def state_dir(model_repository: str | Path) -> Path:
    """``FASTPATH_STATE_DIR`` if set, else a directory under the temp dir keyed by the repository path."""
    explicit = os.environ.get("FASTPATH_STATE_DIR")
    if explicit:
        return Path(explicit)
    key = hashlib.sha256(str(Path(model_repository).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"fastpath-state-{key}"


def instance_key(instance: str, pid: int) -> str:
    """The control-plane name of one model instance's process: Triton's ``model_instance_name`` and the pid (during
    a reload the old and the new stub of one instance name both report)."""
    return f"{instance}.pid{pid}"


def _write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(handle, "w") as stream:
        json.dump(document, stream)
    os.replace(temp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is absent, unreadable or not a UTF-8 JSON object."""
    try:
        document = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: not UTF-8, not JSON
        return None
    return document if isinstance(document, dict) else None


def _process_exists(pid: Any) -> bool:
    """Whether process ``pid`` exists on this host and has not exited (:func:`fastpath.processes.process_running`);
    True when the status names none (nothing to check)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True
    return process_running(pid)


class ControlPlane:
    """Files of one model's control plane under ``root/<model>``."""

    def __init__(self, root: Path, model: str) -> None:
        self.directory = Path(root) / model
        self.desired_path = self.directory / "desired.json"
        self.instances_dir = self.directory / "instances"
        self.recoveries_path = self.directory / "recoveries.json"

    def desired(self) -> dict[str, Any] | None:
        """The latest command, or None."""
        return _read_json(self.desired_path)

    def desired_stamp(self) -> tuple[int, int]:
        """(inode, mtime in ns) of desired.json ((0, 0) when absent): the cheap change check instances poll.

        Each post replaces the file with a new one, so the inode changes even when two posts land
        within one tick of a filesystem's coarse timestamps.
        """
        try:
            stat = self.desired_path.stat()
        except FileNotFoundError:
            return (0, 0)
        return (stat.st_ino, stat.st_mtime_ns)

    def post(self, command: str, **fields: Any) -> int:
        """Write a new command; returns its generation (previous + 1).

        Posts are serialized with an exclusive ``flock`` on ``<model>/.post.lock``: the admin model
        may run several instances (processes) and threads, and an unserialized read-increment-write
        let a stale post overwrite a newer generation, so the instance never saw it and its caller
        waited out the timeout (tests/unit/swaps/test_control.py, concurrent swaps, 3 in 60 runs).
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / ".post.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                previous = self.desired() or {}
                generation = int(previous.get("generation", 0)) + 1
                _write_json_atomic(self.desired_path, {"generation": generation, "command": command, "posted_at": time.time(), **fields})
        except OSError as exc:
            raise SwapError(f"cannot post {command} in the state directory {self.directory}: {exc.filename or ''}: "
                            f"{exc.strerror or exc}; expected a writable directory of regular files "
                            "(FASTPATH_STATE_DIR); nothing was changed") from None
        return generation

    def report(self, instance: str, status: dict[str, Any]) -> None:
        """An instance publishes its status (also its heartbeat) and its process id."""
        _write_json_atomic(self.instances_dir / f"{instance}.json",
                           {**status, "instance": instance, "heartbeat": time.time(), "pid": os.getpid()})

    def withdraw(self, instance: str) -> None:
        """An instance leaves (finalize)."""
        (self.instances_dir / f"{instance}.json").unlink(missing_ok=True)

    def instances(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Statuses of live instances, by instance name: a heartbeat within STALE_AFTER_S from a process that
        still exists. A stub that died (killed, crashed) leaves its last status behind; its process is gone at
        once, so a swap posted right after does not wait STALE_AFTER_S for an instance that will never answer
        (the stubs and the admin model share one host: the state directory is local)."""
        now = time.time() if now is None else now
        live: dict[str, dict[str, Any]] = {}
        for path in sorted(self.instances_dir.glob("*.json")):
            status = _read_json(path)
            if status and now - float(status.get("heartbeat", 0)) <= STALE_AFTER_S and _process_exists(status.get("pid")):
                live[status["instance"]] = status
        return live

    def last_report(self, instance: str) -> dict[str, Any]:
        """The last status ``instance`` (an :func:`instance_key`) published, live or not ({} when it never reported
        or the file is damaged): a stub that died leaves it behind, so its serving version can still be read."""
        return _read_json(self.instances_dir / f"{instance}.json") or {}

    def note_recovery(self, event: dict[str, Any]) -> None:
        """The stub supervisor reloads the model (or gave up): ``event`` holds when (``at``, epoch seconds),
        the ``cause`` (``died`` or ``stalled``) and ``detail``, the stub (``pid``), and the ``outcome``
        (``reloading`` while the reload runs). An event of the same ``at`` and ``pid`` replaces the earlier one
        (the reload's outcome replaces ``reloading``). The last ``RECOVERIES_KEPT`` are kept; one process
        (``fastpath serve``) writes them."""
        key = (event.get("at"), event.get("pid"))
        kept = [entry for entry in self.recoveries() if None in key or (entry.get("at"), entry.get("pid")) != key]
        _write_json_atomic(self.recoveries_path, {"recoveries": (kept + [event])[-RECOVERIES_KEPT:]})

    def recoveries(self) -> list[dict[str, Any]]:
        """The recorded reloads, oldest first ([] when none, or the file is damaged)."""
        entries = (_read_json(self.recoveries_path) or {}).get("recoveries")
        return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []
