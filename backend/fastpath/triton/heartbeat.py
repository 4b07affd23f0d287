"""The stub's side of liveness: count requests in and answers out, publish them every second.

:class:`Progress` is updated on the request path: ``accept`` once per ``execute()`` call, ``answer``
once per request answered, ``advance`` once per finished batch; each is a lock and a clock read
(what they and a beat cost: docs/benchmarks/serving_cpu.md).
:class:`Heartbeat`, a thread of its own, writes the counters as a
:class:`~fastpath.triton.progress.ProgressRecord` every ``HEARTBEAT_S`` (one 56-byte ``pwrite``), so
the cost does not grow with the load, and a stub that cannot run Python at all stops writing, which is
itself the signal. What reads the record and decides: :mod:`fastpath.triton.progress`.

:func:`stub_diagnostics` sets up what every FastPath model stub shares for diagnosis: logging through
:func:`fastpath.triton.logs.configure_stub_logging`, and ``faulthandler`` (a crash prints every thread's
stack into Triton's log; ``kill -USR1 <stub pid>`` prints them on demand, as the stub supervisor does
before it kills a stalled stub; ``FASTPATH_STACK_DUMP=<file>`` appends all stacks to that file every 15 s).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastpath.swaps.control import state_dir
from fastpath.triton.logs import RepeatFilter, configure_stub_logging
from fastpath.triton.progress import ProgressRecord, progress_path

LOG = logging.getLogger(__name__)
HEARTBEAT_S = 1.0
STACK_DUMP_EVERY_S = 15
_stack_files: list[Any] = []  # FASTPATH_STACK_DUMP's file, open for the life of the process


class Progress:
    """Requests accepted and answered by one model instance, and when it last made progress (thread-safe).

    Args:
        clock: CLOCK_MONOTONIC seconds (injected by tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.accepted = self.answered = 0
        self.last_progress_s = clock()

    def accept(self, requests: int) -> None:
        """``requests`` more requests to answer; work arriving at an idle instance restarts its stall clock."""
        now = self._clock()
        with self._lock:
            if self.accepted == self.answered:
                self.last_progress_s = now
            self.accepted += requests

    def answer(self, requests: int = 1) -> None:
        """``requests`` requests were answered (their one response each was sent or returned)."""
        now = self._clock()
        with self._lock:
            self.answered += requests
            self.last_progress_s = now

    def advance(self) -> None:
        """A batch finished (its requests may still wait for other batches)."""
        now = self._clock()
        with self._lock:
            self.last_progress_s = now

    def record(self, pid: int, stall_timeout_s: float) -> ProgressRecord:
        """The counters now, as the record of stub ``pid``."""
        now = self._clock()
        with self._lock:
            return ProgressRecord(pid=pid, heartbeat_s=now, last_progress_s=self.last_progress_s, accepted=self.accepted,
                                  answered=self.answered, stall_timeout_s=stall_timeout_s)


class Heartbeat:
    """Writes ``progress`` to ``path`` every ``interval_s`` from a daemon thread, until :meth:`close`.

    Args:
        path: the record's file (:func:`~fastpath.triton.progress.progress_path`); its directory is created.
        progress: the instance's counters.
        stall_timeout_s: published with the record (the readers' limit).
        interval_s: seconds between writes.
        on_beat: also called at each beat (the log's :meth:`RepeatFilter.flush`).

    Raises:
        OSError: the file cannot be created (raised by :meth:`start`).
    """

    def __init__(self, path: Path, progress: Progress, *, stall_timeout_s: float, interval_s: float = HEARTBEAT_S,
                 on_beat: Callable[[], None] | None = None) -> None:
        self.path, self.progress, self.stall_timeout_s, self.interval_s = Path(path), progress, stall_timeout_s, interval_s
        self._on_beat = on_beat
        self._fd: int | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastpath-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        """Write the first record now, then every ``interval_s``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        """Write the record once (and run ``on_beat``)."""
        if self._fd is not None:
            os.pwrite(self._fd, self.progress.record(os.getpid(), self.stall_timeout_s).encode(), 0)
        if self._on_beat is not None:
            self._on_beat()

    def _run(self) -> None:
        failed = False
        while not self._stopping.wait(self.interval_s):
            try:
                self.beat()
                failed = False
            except Exception as exc:  # a full disk must not end the heartbeat for good
                if not failed:
                    LOG.warning("writing the progress record %s failed: %s", self.path, exc)
                failed = True

    def close(self) -> None:
        """Stop the thread and remove the record (an unloading instance is not watched). Idempotent."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            self.path.unlink(missing_ok=True)


def stub_diagnostics() -> RepeatFilter:
    """Set up the stub's logging and stack dumps (module docstring; once per process). Returns the log's filter."""
    repeat = configure_stub_logging()
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if os.environ.get("FASTPATH_STACK_DUMP") and not _stack_files:
        _stack_files.append(open(os.environ["FASTPATH_STACK_DUMP"], "a"))
        faulthandler.dump_traceback_later(STACK_DUMP_EVERY_S, repeat=True, file=_stack_files[0])
    return repeat


def start_heartbeat(args: dict[str, str], progress: Progress, stall_timeout_s: float,
                    on_beat: Callable[[], None] | None = None) -> Heartbeat | None:
    """Publish ``progress`` for the model instance of Triton's ``initialize`` ``args``; None when
    ``stall_timeout_s`` is 0 (not watched) or the record cannot be written (logged: served unwatched)."""
    if stall_timeout_s <= 0:
        return None
    repository = Path(args["model_repository"]).parent  # args["model_repository"] is the model's own directory
    model = args.get("model_name", Path(args["model_repository"]).name)
    path = progress_path(state_dir(repository), model, args.get("model_instance_name", model), os.getpid())
    try:
        return Heartbeat(path, progress, stall_timeout_s=stall_timeout_s, on_beat=on_beat).start()
    except OSError as exc:
        LOG.warning("no progress record for %s (%s): a stall of this instance will not be seen", path, exc)
        return None
