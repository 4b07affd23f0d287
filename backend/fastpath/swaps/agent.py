"""The serving instance's side of the control plane: a thread that applies posted commands.

Commands (``desired.json``): ``swap`` to ``version``, with a ``reason`` (``swap``, or ``rollback`` when
the admin model resolved a rollback to the recorded previous version). A swap that passes its checks
is written to the serving-version record (``fastpath.swaps.record``) right before the flip. Each instance reports ``{"generation", "ok", "error", "seconds", "pickup_s",
**slots.status(), **details()}`` after applying a command (``pickup_s``: wall-clock seconds from the
admin posting the command to this instance reading it), and rewrites the same status every
HEARTBEAT_S so the admin model knows it is alive.

How the thread learns of a command: on Linux it sleeps on an inotify watch of the model's control
directory (``inotify_simple``), which wakes it when ``desired.json`` is replaced, and re-checks the
file every ``WATCH_RECHECK_S`` in case an event was missed. Where inotify is unavailable (no
``inotify_simple``, not Linux, the per-user inotify limit reached) it polls every ``poll_s``; why the
watch: what polling costs an idle instance (docs/design/hot-swap.md, "What makes a swap fast").
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from fastpath.errors import SwapError, VersionRecordError
from fastpath.swaps.control import HEARTBEAT_S, ControlPlane
from fastpath.swaps.record import VersionRecord, write_record
from fastpath.swaps.slots import EngineSlots

LOG = logging.getLogger(__name__)
WATCH_RECHECK_S = 0.25  # with an inotify watch: also stat desired.json this often (a missed event costs at most this)
# Without inotify: seconds between stat calls on desired.json. Each wake takes the GIL from the serving thread. At 5 ms
# an idle instance spent 2% of a core on it (dev VM), and six served on an H100 0.01 core each: ~115-130 us of stub CPU
# per request at c=1 (docs/benchmarks/served_gpu_h100.md). At 50 ms a command is seen 25 ms later on average, beside
# the 0.8 s or more a swap takes.
POLL_S = 0.05


def _directory_watch(directory: Any, poll_s: float) -> Any:
    """An ``inotify_simple.INotify`` watching ``directory`` for files created or renamed into it, or None
    (no inotify_simple, not Linux, or the kernel refused: e.g. ``fs.inotify.max_user_instances`` reached);
    ``poll_s`` is what the warning names, the agent's polling period without it."""
    try:
        from inotify_simple import INotify, flags
    except ImportError:
        LOG.warning("inotify_simple is not installed: polling %s every %.0f ms for swap commands (an idle instance "
                    "wakes %.0f times a second); pip install inotify_simple", directory, poll_s * 1e3, 1 / poll_s)
        return None
    try:
        watch = INotify()
    except OSError as exc:
        LOG.info("no inotify for the control plane (%s); polling desired.json instead", exc)
        return None
    try:
        watch.add_watch(str(directory), flags.MOVED_TO | flags.CREATE | flags.CLOSE_WRITE)
    except OSError as exc:
        watch.close()
        LOG.info("no inotify watch on %s (%s); polling desired.json instead", directory, exc)
        return None
    return watch


class SwapAgent:
    """Polls the control plane and applies commands to ``slots``.

    Commands posted before the instance started are history, except the latest when it is a swap to another
    version than this instance serves that the record does not show applied: a reload that lands mid-swap then
    applies it too, so no instance ends on a version other than the one the swap reports.

    Args:
        plane, instance, slots: the model's control plane; this instance's name (Triton's ``model_instance_name``);
            its engine slots.
        load, validate: version -> engine (see :meth:`EngineSlots.swap`); (engine, version) -> None, raising on failure.
        poll_s: without inotify, seconds between ``stat`` calls (inode and mtime) on desired.json.
        watch: wait on an inotify watch of the control directory (see the module docstring); False polls.
        details: extra fields for the status report (e.g. the last swap's stage timings).
        record_path: the serving-version record (:mod:`fastpath.swaps.record`), written by a swap after validation
            and before the flip; None: swaps are not recorded. record: the one read at load (None: none).
        serving: how the active version came to serve, ``{"since": epoch s, "reason": ...}`` (``loaded``,
            ``swap``, ``rollback``), reported with the status.
    """

    def __init__(self, plane: ControlPlane, instance: str, slots: EngineSlots, load: Callable[[int], Any],
                 validate: Callable[[Any, int], None], *, poll_s: float = POLL_S, watch: bool = True,
                 details: Callable[[], dict[str, Any]] | None = None, record_path: Any = None,
                 record: VersionRecord | None = None, serving: dict[str, Any] | None = None) -> None:
        self.plane, self.instance, self.slots = plane, instance, slots
        self._load, self._validate, self._poll_s = load, validate, poll_s
        self._watch_wanted = watch
        self._watch: Any = None
        self._poller: select.poll | None = None
        self._wake: tuple[int, int] | None = None  # a pipe stop() writes to, so a waiting thread ends at once
        self._details = details
        self._record_path = record_path
        self.serving = serving or {"since": time.time(), "reason": "loaded"}
        desired = plane.desired() or {}
        self.generation = int(desired.get("generation", 0))  # commands posted before this instance started are history
        self._seen_stamp = plane.desired_stamp()
        if (desired.get("command") == "swap" and desired.get("version") != slots.active_version
                and not (record is not None and record.applied(plane.directory.parent, self.generation))):
            self.generation -= 1  # ... but a swap still being applied is this instance's to apply too
            self._seen_stamp = (0, 0)
        self._last: dict[str, Any] = {"ok": True, "error": None}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fastpath-swap-{instance}", daemon=True)

    def start(self) -> SwapAgent:
        self._report()  # creates the control directory, so it can be watched
        if self._watch_wanted:
            self._watch = _directory_watch(self.plane.directory, self._poll_s)
        if self._watch is not None:
            self._wake = os.pipe()
            self._poller = select.poll()
            self._poller.register(self._watch.fileno(), select.POLLIN)
            self._poller.register(self._wake[0], select.POLLIN)
        self._thread.start()
        return self

    @property
    def watching(self) -> bool:
        """True when the thread waits on an inotify watch rather than polling every ``poll_s``."""
        return self._watch is not None

    def _wait(self) -> bool:
        """Sleep until the control directory changes (watch) or ``poll_s`` passes; True when stopping."""
        watch, poller = self._watch, self._poller
        if watch is None or poller is None:
            return self._stop.wait(self._poll_s)
        try:
            if poller.poll(int(WATCH_RECHECK_S * 1000)):
                watch.read(timeout=0)  # drain: the events only wake us; poll_once checks the file itself
        except (OSError, ValueError):  # closed by stop() after its join timed out, or the kernel failed it
            self._watch = None
        return self._stop.is_set()

    def _report(self) -> None:
        details = self._details() if self._details is not None else {}
        self.plane.report(self.instance, {"generation": self.generation, **self._last, **self.slots.status().as_dict(),
                                          "serving_since": self.serving["since"], "serving_reason": self.serving["reason"], **details})

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
        generation = int(desired["generation"])
        reason = desired.get("reason", "swap")
        if command == "cancel":  # the admin withdrew an earlier command (no instance was live to apply it)
            self.generation = generation
            self._report()
            return
        try:
            if command != "swap":
                raise SwapError(f"unknown command {command!r}; expected swap (a rollback is posted as a swap to the previous version)")
            version = int(desired["version"])
            if version == self.slots.active_version:  # nothing to flip; the record may still name another version
                seconds = 0.0  # (one that could not be restored): it now names this one, so a reload comes back here
                self._record(version, self.slots.previous_version, None, generation, ok=True)
            else:
                seconds = self.slots.swap(version, self._load, self._validate,
                                          commit=lambda new, old: self._record(new, old, reason, generation, ok=True))
                self.serving = {"since": time.time(), "reason": reason}
            self._last = {"ok": True, "error": None, "seconds": seconds, "pickup_s": pickup_s}
            LOG.info("%s: %s to version %s done in %.3f s", self.instance, reason, version, seconds)
        except Exception as exc:  # reported to the caller through the status file
            self._last = {"ok": False, "error": str(exc), "pickup_s": pickup_s}
            LOG.warning("%s: %s refused: %s", self.instance, reason, exc)
            try:  # the refused command is recorded too, so a reload does not apply it again
                self._record(self.slots.active_version, self.slots.previous_version, None, generation, ok=False)
            except VersionRecordError as record_error:
                LOG.warning("%s: %s", self.instance, record_error)
        self.generation = generation
        self._report()

    def _record(self, version: int, previous: int | None, reason: str | None, generation: int, *, ok: bool) -> None:
        """Write the serving-version record (``reason`` None keeps the recorded one: a refused command)."""
        if self._record_path is None:
            return
        write_record(self._record_path, VersionRecord(
            version=version, previous_version=previous, since=time.time() if reason else self.serving["since"],
            reason=reason or self.serving["reason"],
            state_dir=str(self.plane.directory.parent), generation=generation, ok=ok))

    def _run(self) -> None:
        next_heartbeat = time.monotonic() + HEARTBEAT_S
        while not self._wait():
            try:
                if self.poll_once() or time.monotonic() >= next_heartbeat:
                    self._report()
                    next_heartbeat = time.monotonic() + HEARTBEAT_S
            except Exception:  # never let the control thread die silently
                LOG.exception("swap agent %s: poll failed", self.instance)

    def stop(self) -> None:
        """Stop polling and withdraw this instance from the control plane (idempotent)."""
        self._stop.set()
        if self._wake is not None:
            os.write(self._wake[1], b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        watch, wake = self._watch, self._wake
        self._watch = self._poller = self._wake = None
        if watch is not None:
            watch.close()
        if wake is not None:
            os.close(wake[0])
            os.close(wake[1])
        self.plane.withdraw(self.instance)
