"""The serving instance's side of the control plane: a thread that applies posted commands.

Commands (``desired.json``): ``swap`` to ``version``; ``rollback`` to the version served before the
last flip. Each instance reports ``{"generation", "ok", "error", "seconds", "pickup_s",
**slots.status(), **details()}`` after applying a command (``pickup_s``: wall-clock seconds from the
admin posting the command to this instance reading it), and rewrites the same status every
HEARTBEAT_S so the admin model knows it is alive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fastpath.repository.control import HEARTBEAT_S, ControlPlane
from fastpath.repository.slots import EngineSlots, SwapError

LOG = logging.getLogger(__name__)


class SwapAgent:
    """Polls the control plane and applies commands to ``slots``.

    Args:
        plane: the model's control plane.
        instance: this instance's name (Triton's ``model_instance_name``).
        slots: the instance's engine slots.
        load: version -> engine (see :meth:`EngineSlots.swap`).
        validate: (engine, version) -> None, raising on failure.
        poll_s: seconds between ``stat`` calls on desired.json (inode and mtime; one ``stat`` of one small file:
            at 5 ms, 200 system calls a second, and a command waits 2.5 ms on average to be seen).
        details: extra fields for the status report (e.g. the last swap's stage timings).
    """

    def __init__(self, plane: ControlPlane, instance: str, slots: EngineSlots, load: Callable[[int], Any],
                 validate: Callable[[Any, int], None], *, poll_s: float = 0.005,
                 details: Callable[[], dict[str, Any]] | None = None) -> None:
        self.plane, self.instance, self.slots = plane, instance, slots
        self._load, self._validate, self._poll_s = load, validate, poll_s
        self._details = details
        desired = plane.desired() or {}
        self.generation = int(desired.get("generation", 0))  # commands posted before this instance started are history
        self._seen_stamp = plane.desired_stamp()
        self._last: dict[str, Any] = {"ok": True, "error": None}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fastpath-swap-{instance}", daemon=True)

    def start(self) -> "SwapAgent":
        self._report()
        self._thread.start()
        return self

    def _report(self) -> None:
        details = self._details() if self._details is not None else {}
        self.plane.report(self.instance, {"generation": self.generation, **self._last, **self.slots.status().as_dict(), **details})

    def poll_once(self) -> bool:
        """Apply a newly posted command, if any. Returns True when one was applied."""
        stamp = self.plane.desired_stamp()
        if stamp == self._seen_stamp:
            return False
        self._seen_stamp = stamp
        desired = self.plane.desired()
        if not desired or int(desired["generation"]) <= self.generation:
            return False
        self._apply(desired)
        return True

    def _apply(self, desired: dict[str, Any]) -> None:
        command = desired.get("command")
        pickup_s = round(max(0.0, time.time() - float(desired.get("posted_at", time.time()))), 4)
        try:
            if command == "swap":
                version = int(desired["version"])
            elif command == "rollback":
                version = self.slots.previous_version
                if version is None:
                    raise SwapError("nothing to roll back to: this instance has not swapped since it loaded")
            else:
                raise SwapError(f"unknown command {command!r}; expected swap or rollback")
            if version == self.slots.active_version:
                seconds = 0.0
            else:
                seconds = self.slots.swap(version, self._load, self._validate)
            self._last = {"ok": True, "error": None, "seconds": seconds, "pickup_s": pickup_s}
            LOG.info("%s: %s to version %s done in %.3f s", self.instance, command, version, seconds)
        except Exception as exc:  # reported to the caller through the status file
            self._last = {"ok": False, "error": str(exc), "pickup_s": pickup_s}
            LOG.warning("%s: %s refused: %s", self.instance, command, exc)
        self.generation = int(desired["generation"])
        self._report()

    def _run(self) -> None:
        next_heartbeat = time.monotonic() + HEARTBEAT_S
        while not self._stop.wait(self._poll_s):
            try:
                if self.poll_once() or time.monotonic() >= next_heartbeat:
                    self._report()
                    next_heartbeat = time.monotonic() + HEARTBEAT_S
            except Exception:  # never let the control thread die silently
                LOG.exception("swap agent %s: poll failed", self.instance)

    def stop(self) -> None:
        """Stop polling and withdraw this instance from the control plane (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.plane.withdraw(self.instance)
