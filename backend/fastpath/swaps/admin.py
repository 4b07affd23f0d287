"""The admin service behind the ``fastpath_admin`` model: swap, rollback, status, versions.

A request is one JSON document, e.g. ``{"command": "swap", "model": "text_embedding", "version": 2,
"key": "..."}``; the reply is a JSON document with the aggregated status of the model's instances:
their serving versions (models with live swaps), their liveness (``progress``: requests in flight,
seconds since the last progress and heartbeat, ``stalled`` and why; :mod:`fastpath.triton.progress`),
and the stub supervisor's reloads of the model with their causes (``recoveries``).
Mutating commands need the admin key (``FASTPATH_ADMIN_KEY`` in tritonserver's environment),
compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastpath.errors import FastPathError, InvalidInputError, PermissionDeniedError, SwapError, VersionRecordError
from fastpath.swaps.control import ControlPlane
from fastpath.swaps.record import read_record, record_path
from fastpath.triton.progress import live_progress

LOG = logging.getLogger(__name__)
MUTATING = ("swap", "rollback")
COMMANDS = (*MUTATING, "status", "versions")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")  # a directory name: at most 255 bytes, not . or ..


class AdminService:
    """Handles admin commands for every model in one model repository.

    Args:
        model_repository: the repository directory (version directories are looked up there).
        state_root: the control-plane state directory.
        admin_key: the key mutating commands must carry; empty disables them.
        timeout_s: how long a swap waits for all instances.
        clock, sleep: injected for tests.
    """

    def __init__(self, model_repository: Path, state_root: Path, admin_key: str, *, timeout_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.model_repository, self.state_root, self._key = Path(model_repository), Path(state_root), admin_key
        self.timeout_s, self._clock, self._sleep = timeout_s, clock, sleep

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one command; returns the reply document. A refused swap or rollback is logged (WARNING, in
        Triton's log) with its reason, whether the admin model or an instance refused it.

        Raises:
            InvalidInputError: malformed request, unknown model or version (HTTP 400).
            PermissionDeniedError: missing or wrong key for swap/rollback.
            fastpath.swaps.slots.SwapError: an instance refused the new version (the reason is included).
        """
        try:
            return self._handle(request)
        except Exception as exc:
            if request.get("command") in MUTATING:
                LOG.warning("%s of model %r to version %r refused: %s", request["command"], request.get("model"),
                            request.get("version", "previous"), exc)
            raise

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if "command" not in request:
            raise InvalidInputError(f"REQUEST: 'command' is required, one of {', '.join(COMMANDS)}")
        command = request["command"]
        if command not in COMMANDS:
            raise InvalidInputError(f"REQUEST: command {command!r} is not one of {', '.join(COMMANDS)}")
        if not isinstance(request.get("model"), str):
            raise InvalidInputError(f"REQUEST: 'model' is required, a model name string; got {request.get('model')!r}")
        model = request["model"]
        if not _MODEL_NAME.match(model) or not (self.model_repository / model / "config.pbtxt").is_file():
            raise InvalidInputError(f"model {model!r} is not in the model repository {self.model_repository}")
        if command in MUTATING:
            self._authorize(request.get("key"))
        plane = ControlPlane(self.state_root, model)
        if command == "versions":
            return {"model": model, "versions": self.versions(model)}
        if command == "status":
            return self._summary(model, plane.instances())
        if not plane.instances():
            raise self._not_loaded(model)
        if command == "swap":
            version = request.get("version")
            if not isinstance(version, int) or isinstance(version, bool):
                raise InvalidInputError(f"REQUEST: 'version' must be an integer version of {model} "
                                        f"({', '.join(self.versions(model))}); got {version!r}")
            if str(version) not in self.versions(model):
                raise InvalidInputError(f"version {version!r} of {model} is not in the repository; available: {self.versions(model)}")
            generation = plane.post("swap", version=version, reason="swap")
        else:
            version = self._previous_version(model, plane)
            generation = plane.post("swap", version=version, reason="rollback")
        return self._await(model, plane, generation, version)

    def _previous_version(self, model: str, plane: ControlPlane) -> int:
        """What a rollback returns to: the recorded previous version, else (no record, or one that cannot
        be read) the one the live instances report.

        Raises:
            SwapError: neither names a previous version; the message says why, with the record's problem.
        """
        unreadable = ""
        try:
            record = read_record(record_path(self.model_repository / model))
        except VersionRecordError as exc:
            record, unreadable = None, f" ({exc})"
        previous = {record.previous_version} if record is not None else {s.get("previous_version") for s in plane.instances().values()}
        if len(previous) != 1 or None in previous:
            raise SwapError(f"nothing to roll back to: {model} has not been swapped since it was first loaded{unreadable}")
        return previous.pop()

    def versions(self, model: str) -> list[str]:
        """Version directories of ``model`` (numeric names), ascending."""
        return sorted((p.name for p in (self.model_repository / model).iterdir() if p.is_dir() and p.name.isdigit()), key=int)

    def _authorize(self, key: Any) -> None:
        if not self._key:
            raise PermissionDeniedError("swaps are disabled: tritonserver was started without FASTPATH_ADMIN_KEY")
        if not isinstance(key, str) or not hmac.compare_digest(key.encode(), self._key.encode()):
            raise PermissionDeniedError("admin key missing or wrong: set FASTPATH_ADMIN_KEY to the server's key (`fastpath serve` logs the file it wrote it to, ~/.cache/fastpath/admin_key.<port>)")

    def _await(self, model: str, plane: ControlPlane, generation: int, version: int) -> dict[str, Any]:
        """Wait until every live instance has applied ``generation``; the summary once all serve ``version``.

        Raises:
            SwapError: an instance refused, or one serves another version (the reply never names a
                version that is not the one serving).
        """
        deadline = self._clock() + self.timeout_s
        while True:
            instances = plane.instances()
            if not instances:  # unloaded meanwhile: cancel the command, so a later load does not apply it
                plane.post("cancel", cancelled=generation)
                raise self._not_loaded(model)
            if all(int(s.get("generation", 0)) >= generation for s in instances.values()):
                summary = self._summary(model, instances)
                errors = [f"{name}: {s['error']}" for name, s in instances.items() if not s.get("ok")]
                if errors:
                    raise SwapError("; ".join(errors) + f" (still serving version {summary['active_versions']})")
                if summary["active_versions"] != [version]:
                    raise SwapError(f"{model}: asked for version {version}, but its instances serve {summary['active_versions']}")
                return summary
            if self._clock() >= deadline:
                raise FastPathError(f"{model}: instances did not finish generation {generation} within {self.timeout_s:.0f} s")
            self._sleep(0.005)

    @staticmethod
    def _not_loaded(model: str) -> InvalidInputError:
        return InvalidInputError(f"model {model} has no live FastPath instances that swap versions: it is not loaded, "
                                 "or it is not a FastPath model with live swaps (text_embedding is); nothing was changed")

    def _summary(self, model: str, instances: dict[str, dict[str, Any]]) -> dict[str, Any]:
        active = sorted({s.get("active_version") for s in instances.values()})
        try:
            record = read_record(record_path(self.model_repository / model))
            recorded: dict[str, Any] | None = record.as_dict() if record else None
        except VersionRecordError as exc:
            recorded = {"error": str(exc)}
        now_s = self._clock()  # CLOCK_MONOTONIC by default, as the progress records
        progress = {name: record.describe(now_s) for name, record in live_progress(self.state_root, model).items()}
        return {"model": model, "active_versions": active, "active_version": active[0] if len(active) == 1 else None,
                "recorded": recorded, "instances": instances, "progress": progress,
                "recoveries": ControlPlane(self.state_root, model).recoveries()}
