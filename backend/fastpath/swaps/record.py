"""The serving version of a model, recorded where a reload or a restart finds it.

Triton's own load reads only ``config.pbtxt`` and the version directories, so that a reload or a restart comes
back on the version last swapped to, each instance writes this record after the new version passed its checks
and before its flip, and every instance reads it when it loads:

    {"version": 2, "previous_version": 1, "since": 1764620000.0, "reason": "swap",
     "command": {"state_dir": "/tmp/fastpath-state-...", "generation": 3, "ok": true}}

``command`` names the control-plane command that last wrote it, so an instance that loads while that command is
applied knows whether it has been (:class:`~fastpath.swaps.agent.SwapAgent`). Where:
``$FASTPATH_VERSION_STATE_DIR/<model>.json`` when set, else ``serving_version.json`` beside the model's
``config.pbtxt``; writes are atomic (temporary file, fsync, ``rename(2)``). Reading raises only
:class:`~fastpath.errors.VersionRecordError` (``record unreadable: <path>: <what is wrong>``), reads at most
:data:`MAX_RECORD_BYTES` and ignores unknown keys. How a damaged record is handled: docs/design/hot-swap.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import reprlib
import stat
import tempfile
from pathlib import Path
from typing import Any

from fastpath.errors import VersionRecordError

RECORD_NAME = "serving_version.json"
STATE_DIR_ENV = "FASTPATH_VERSION_STATE_DIR"
REASONS = ("loaded", "swap", "rollback")  # the reasons FastPath writes; a record may hold any other text
UNREADABLE = "record unreadable"
# A record is a few hundred bytes; a file larger than this is not one, and is refused without reading it whole.
MAX_RECORD_BYTES = 64 * 1024
# 9999-12-31T23:59:59Z: time.localtime formats it on every platform (the load's log line shows ``since``).
MAX_SINCE_S = 253402300799.0
_EXAMPLE = '{"version": 2, "previous_version": 1}'
_SHOW = reprlib.Repr()  # bounded reprs for messages: a value may be a huge or deeply nested JSON structure
_SHOW.maxlevel, _SHOW.maxdict, _SHOW.maxlist, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong = 1, 3, 3, 40, 40, 40


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def record_path(model_dir: Path) -> Path:
    """Where the serving-version record of the model in ``model_dir`` lives (module docstring)."""
    explicit = os.environ.get(STATE_DIR_ENV)
    model_dir = Path(model_dir)
    return Path(explicit) / f"{model_dir.name}.json" if explicit else model_dir / RECORD_NAME


@dataclasses.dataclass(frozen=True, kw_only=True)
class VersionRecord:
    """A model's recorded serving version.

    Attributes:
        version: the version to serve (>= 1).
        previous_version: the version served before it (what rollback returns to), or None.
        since: when the version was recorded, seconds since the epoch (0 to :data:`MAX_SINCE_S`).
        reason: how the version came to serve: FastPath writes ``swap``, ``rollback``, or ``loaded`` (the
            version Triton loaded, recorded when a swap away from it was refused); other text is kept as written.
        state_dir: the control-plane directory of the command that last wrote the record.
        generation: that command's generation in ``state_dir``.
        ok: whether that command succeeded (a refused swap records its generation, version unchanged).
    """

    version: int
    previous_version: int | None = None
    since: float = 0.0
    reason: str = "swap"
    state_dir: str = ""
    generation: int = 0
    ok: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not _is_int(self.version) or self.version < 1:
            problems.append(f"version {_SHOW.repr(self.version)}: expected an integer >= 1")
        if self.previous_version is not None and (not _is_int(self.previous_version) or self.previous_version < 1):
            problems.append(f"previous_version {_SHOW.repr(self.previous_version)}: expected an integer >= 1 or null")
        if not isinstance(self.since, (int, float)) or isinstance(self.since, bool) or not (0 <= self.since <= MAX_SINCE_S):
            problems.append(f"since {_SHOW.repr(self.since)}: expected seconds since the epoch, 0 to {MAX_SINCE_S:.0f}")
        if not isinstance(self.reason, str):
            problems.append(f"reason {_SHOW.repr(self.reason)}: expected a string such as {', '.join(REASONS)}")
        if not isinstance(self.state_dir, str):
            problems.append(f"command.state_dir {_SHOW.repr(self.state_dir)}: expected a string")
        if not _is_int(self.generation) or self.generation < 0:
            problems.append(f"command.generation {_SHOW.repr(self.generation)}: expected an integer >= 0")
        if not isinstance(self.ok, bool):
            problems.append(f"command.ok {_SHOW.repr(self.ok)}: expected true or false")
        if problems:
            raise VersionRecordError("; ".join(problems))

    def applied(self, state_dir: Path | str, generation: int) -> bool:
        """True when the record was written by command ``generation`` of ``state_dir``."""
        return self.state_dir == str(state_dir) and self.generation == generation

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "previous_version": self.previous_version, "since": self.since,
                "reason": self.reason, "command": {"state_dir": self.state_dir, "generation": self.generation, "ok": self.ok}}


def read_record(path: Path) -> VersionRecord | None:
    """The record at ``path``, or None when there is none (the model has never been swapped there).

    Raises:
        VersionRecordError: the file exists but is not a valid record: unreadable, larger than
            :data:`MAX_RECORD_BYTES`, not UTF-8, not JSON (or nested too deep to parse), not an object,
            or a field of the wrong type or range. The message is ``record unreadable: <path>: <what is
            wrong>``; nothing else is raised, whatever the file holds.
    """
    try:
        data = _read_bounded(Path(path))
        if data is None:
            return None
        if not data.strip():
            raise VersionRecordError("is empty (a write cut short?)")
        document = json.loads(data.decode("utf-8"))
        return _parse(document)
    except VersionRecordError as exc:
        problem = str(exc)
    except OSError as exc:
        problem = f"cannot be read ({exc})"
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start}: {exc.reason})"
    except RecursionError:
        problem = "is not a JSON record: nested too deeply to parse"
    except ValueError as exc:  # json.JSONDecodeError, or an integer too long to convert
        problem = f"is not a JSON record ({exc})"
    raise VersionRecordError(f"{UNREADABLE}: {path}: {problem}; expected JSON like {_EXAMPLE}")


def _read_bounded(path: Path) -> bytes | None:
    """The file's bytes, or None when it does not exist; refuses anything but a regular file of at most
    :data:`MAX_RECORD_BYTES` (``O_NONBLOCK``: a FIFO put there does not block the load)."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise VersionRecordError("is not a regular file")
        with os.fdopen(handle, "rb", closefd=False) as stream:
            data = stream.read(MAX_RECORD_BYTES + 1)
    finally:
        os.close(handle)
    if len(data) > MAX_RECORD_BYTES:
        raise VersionRecordError(f"is larger than {MAX_RECORD_BYTES} bytes (MAX_RECORD_BYTES; a record is a few hundred)")
    return data


def _parse(document: Any) -> VersionRecord:
    """A :class:`VersionRecord` from a parsed JSON document (its types are checked by the record itself)."""
    if not isinstance(document, dict):
        kinds = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "array"}
        raise VersionRecordError(f"holds a JSON {kinds.get(type(document), type(document).__name__)}, not an object")
    if "version" not in document:
        raise VersionRecordError(f"has no version field (keys: {_SHOW.repr(sorted(document))})")
    command = document.get("command")
    if command is None:
        command = {}
    elif not isinstance(command, dict):
        raise VersionRecordError(f"command {_SHOW.repr(command)}: expected an object")
    since = document.get("since", 0.0)
    return VersionRecord(version=document["version"], previous_version=document.get("previous_version"),
                         since=float(since) if _is_int(since) and abs(since) <= MAX_SINCE_S else since,
                         reason=document.get("reason", "swap"), state_dir=command.get("state_dir", ""),
                         generation=command.get("generation", 0), ok=command.get("ok", True))


def write_record(path: Path, record: VersionRecord) -> None:
    """Replace the record at ``path`` atomically (temporary file, fsync, rename).

    Raises:
        VersionRecordError: the directory is not writable (the message says how to choose another).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(handle, "w") as stream:
                json.dump(record.as_dict(), stream)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise VersionRecordError(f"cannot record the serving version in {path} ({exc}); make the model's directory "
                                 f"writable or set {STATE_DIR_ENV} to a writable directory") from exc
