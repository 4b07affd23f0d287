"""A model instance's progress record: how FastPath tells a stub that stopped answering.

Triton 2.51 keeps a model ready while its stub answers nothing (stopped, or its scheduler makes no progress), so
each scheduled FastPath model instance's heartbeat thread (:mod:`fastpath.triton.heartbeat`) rewrites a 56-byte
record every second at ``<state>/<model>/progress/<instance>.<pid>``, ``<state>`` being the stub's
``FASTPATH_STATE_DIR`` (beside the control plane, :mod:`fastpath.swaps.control`). It is written in place with one
``pwrite`` and checked by a CRC-32 (a read that races a write reads again), and holds the pid, when it was
written and when the instance last made progress (``CLOCK_MONOTONIC`` seconds, comparable across one host's
processes), the requests accepted and answered, and ``stall_timeout_s`` (0 = not checked).

:meth:`ProgressRecord.stalled` is the one verdict the stub supervisor, the liveness probe and the admin
``status`` use: stalled when the heartbeat is older than ``stall_timeout_s``, or when requests are in flight and
none was answered and no batch finished for that long. Why: docs/deployment.md#health-liveness-and-stalled-models.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path
from typing import Any

MAGIC = b"FPP1"
_LAYOUT = struct.Struct("<4sqddqqd")  # magic, pid, heartbeat_s, last_progress_s, accepted, answered, stall_timeout_s
_CRC = struct.Struct("<I")
RECORD_BYTES = _LAYOUT.size + _CRC.size
READ_ATTEMPTS = 3  # a read that meets a half-written record reads again


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgressRecord:
    """One instance's published progress (module docstring).

    Attributes:
        pid: the stub process.
        heartbeat_s: when the record was written, CLOCK_MONOTONIC seconds.
        last_progress_s: when a request was last answered or a batch finished, or (if later) when
            requests arrived at an idle instance; CLOCK_MONOTONIC seconds.
        accepted, answered: requests handed to ``execute()`` and requests answered since the load.
        stall_timeout_s: the instance's ``stall_timeout_s``; 0 = never stalled.
    """

    pid: int
    heartbeat_s: float
    last_progress_s: float
    accepted: int
    answered: int
    stall_timeout_s: float

    @property
    def in_flight(self) -> int:
        """Requests accepted and not answered yet."""
        return self.accepted - self.answered

    def encode(self) -> bytes:
        """The record's ``RECORD_BYTES`` bytes."""
        body = _LAYOUT.pack(MAGIC, self.pid, self.heartbeat_s, self.last_progress_s, self.accepted, self.answered,
                            self.stall_timeout_s)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes) -> ProgressRecord | None:
        """The record in ``data``, or None when it is short, torn (CRC mismatch) or not a progress record."""
        if len(data) != RECORD_BYTES or zlib.crc32(data[:_LAYOUT.size]) != _CRC.unpack_from(data, _LAYOUT.size)[0]:
            return None
        magic, pid, heartbeat_s, last_progress_s, accepted, answered, stall_timeout_s = _LAYOUT.unpack_from(data)
        if magic != MAGIC:
            return None
        return cls(pid=pid, heartbeat_s=heartbeat_s, last_progress_s=last_progress_s, accepted=accepted,
                   answered=answered, stall_timeout_s=stall_timeout_s)

    def stalled(self, now_s: float) -> str | None:
        """Why the instance has stopped answering at ``now_s`` (CLOCK_MONOTONIC seconds), or None while it has not."""
        limit_s = self.stall_timeout_s
        if limit_s <= 0:
            return None
        silent_s = now_s - self.heartbeat_s
        if silent_s > limit_s:
            return (f"its heartbeat stopped {silent_s:.0f} s ago (stall_timeout_s {limit_s:g}): the stub is stopped or a "
                    f"thread has held the Python GIL that long, so every request to it hangs or fails "
                    f"({self.in_flight} in flight at the last heartbeat)")
        idle_s = now_s - self.last_progress_s
        if self.in_flight > 0 and idle_s > limit_s:
            return (f"{self.in_flight} requests in flight and no response sent and no batch finished for {idle_s:.0f} s "
                    f"(stall_timeout_s {limit_s:g})")
        return None

    def describe(self, now_s: float) -> dict[str, Any]:
        """The record as the admin ``status`` shows it: counts, ages in seconds, and ``stalled`` (why, or None)."""
        return {"pid": self.pid, "in_flight": self.in_flight, "accepted": self.accepted, "answered": self.answered,
                "seconds_since_progress": round(now_s - self.last_progress_s, 1),
                "seconds_since_heartbeat": round(now_s - self.heartbeat_s, 1),
                "stall_timeout_s": self.stall_timeout_s, "stalled": self.stalled(now_s)}


def progress_dir(state_root: str | Path, model: str) -> Path:
    """The directory of ``model``'s progress records."""
    return Path(state_root) / model / "progress"


def progress_path(state_root: str | Path, model: str, instance: str, pid: int) -> Path:
    """Where the stub ``pid`` of model instance ``instance`` publishes its record."""
    return progress_dir(state_root, model) / f"{instance}.{pid}"


def read_progress(path: str | Path) -> ProgressRecord | None:
    """The record at ``path``; None when there is none (not published yet, or removed) or it stays unreadable."""
    for _ in range(READ_ATTEMPTS):
        try:
            data = Path(path).read_bytes()
        except OSError:
            return None
        record = ProgressRecord.decode(data)
        if record is not None:
            return record
    return None


def live_progress(state_root: str | Path, model: str) -> dict[str, ProgressRecord]:
    """The records of ``model``'s running stubs by ``<instance>.<pid>``: a record counts while process
    ``pid`` runs with the instance's name on its command line (a stub that was killed leaves its file)."""
    records: dict[str, ProgressRecord] = {}
    for path in sorted(progress_dir(state_root, model).glob("*.*")):
        instance, _, pid = path.name.rpartition(".")
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        record = read_progress(path)
        if record is not None and instance.encode() in argv:
            records[path.name] = record
    return records
