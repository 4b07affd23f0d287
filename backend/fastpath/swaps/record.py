"""The serving version of a model, recorded where a reload or a restart finds it.

A live swap happens inside the running instances, while Triton's own load reads only
``config.pbtxt`` and the version directories (its ``version_policy``). So that a reload through
Triton's repository API (a config override, an operator's load) or a server restart comes back on
the version last swapped to, each instance writes this record after the new version passed its
checks and before its flip, and every instance reads it when it loads:

    {"version": 2, "previous_version": 1, "since": 1764620000.0, "reason": "swap",
     "command": {"state_dir": "/tmp/fastpath-state-...", "generation": 3, "ok": true}}

``command`` names the control-plane command that last wrote it (its state directory and
generation, and whether it succeeded), so an instance that loads while that command is still being
applied knows whether it has been (see :class:`~fastpath.swaps.agent.SwapAgent`).

Where: ``$FASTPATH_VERSION_STATE_DIR/<model>.json`` when that variable is set (a volume, for a
read-only model repository), else ``serving_version.json`` in the model's directory of the model
repository, beside ``config.pbtxt`` (Triton takes only numeric directories there for versions).
Writes are atomic: a temporary file in the same directory, fsync, ``rename(2)``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fastpath.errors import VersionRecordError

RECORD_NAME = "serving_version.json"
STATE_DIR_ENV = "FASTPATH_VERSION_STATE_DIR"
REASONS = ("loaded", "swap", "rollback")


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
        since: when the version was recorded, seconds since the epoch.
        reason: how the version came to serve: ``swap``, ``rollback``, or ``loaded`` (the version Triton
            loaded, recorded when a swap away from it was refused).
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
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise VersionRecordError(f"version {self.version!r}: expected an integer >= 1")
        if self.previous_version is not None and (not isinstance(self.previous_version, int) or self.previous_version < 1):
            raise VersionRecordError(f"previous_version {self.previous_version!r}: expected an integer >= 1 or null")
        if self.reason not in REASONS:
            raise VersionRecordError(f"reason {self.reason!r}: expected one of {', '.join(REASONS)}")

    def applied(self, state_dir: Path | str, generation: int) -> bool:
        """True when the record was written by command ``generation`` of ``state_dir``."""
        return self.state_dir == str(state_dir) and self.generation == generation

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "previous_version": self.previous_version, "since": self.since,
                "reason": self.reason, "command": {"state_dir": self.state_dir, "generation": self.generation, "ok": self.ok}}


def read_record(path: Path) -> VersionRecord | None:
    """The record at ``path``, or None when there is none (the model has never been swapped there).

    Raises:
        VersionRecordError: the file exists but cannot be read or is not a valid record; the
            message names the file and what is wrong with it.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise VersionRecordError(f"{path}: cannot be read ({exc})") from exc
    try:
        document = json.loads(text)
        if not isinstance(document, dict):
            raise VersionRecordError(f"holds a JSON {type(document).__name__}, not an object; expected JSON like "
                                     f"{{\"version\": 2, \"previous_version\": 1}}")
        command = document.get("command") or {}
        return VersionRecord(version=document["version"], previous_version=document.get("previous_version"),
                             since=float(document.get("since", 0.0)), reason=document.get("reason", "swap"),
                             state_dir=str(command.get("state_dir", "")), generation=int(command.get("generation", 0)),
                             ok=bool(command.get("ok", True)))
    except VersionRecordError as exc:
        raise VersionRecordError(f"{path}: {exc}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise VersionRecordError(f"{path} is not a serving-version record ({type(exc).__name__}: {exc}); "
                                 f"expected JSON like {{\"version\": 2, \"previous_version\": 1}}") from None


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
