"""FastPath's logging inside a python-backend stub: one handler, and no flood from a loop of errors.

A stub's ``fastpath.*`` loggers write to the stub's stderr, which Triton puts in its log. A fault
that repeats (a scheduler thread failing on every wake-up, an engine error on every batch) used to
write the same traceback thousands of times a second: ~100 MB of log a minute, which hides
everything else and fills disks. :func:`configure_stub_logging` (called by every FastPath model's
``initialize``) gives the ``fastpath`` logger one stderr handler, at the level it had (WARNING
unless configured), with a :class:`RepeatFilter`: of the records of one logger with one message
template (``record.msg`` before its arguments are filled in) at one level, the first
``max_per_window`` within ``window_s`` pass (INFO records of the event loggers, a swap's outcome,
always pass); the rest are counted, and one line says how many were left out when the next one of
them comes after the window, or at :meth:`RepeatFilter.flush`
(the heartbeat calls it every second, :mod:`fastpath.triton.heartbeat`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable

LOG_FORMAT = "%(asctime)s fastpath %(levelname)s %(name)s: %(message)s"
MAX_PER_WINDOW = 5
WINDOW_S = 60.0
MAX_TEMPLATES = 256  # templates tracked at once; the one seen least recently is dropped beyond it
# Loggers whose INFO records are events an operator expects in Triton's log at its default verbosity, as Triton's own
# "successfully loaded" lines are: a live version swap, done or refused, once per instance. A level set for them wins.
# Their INFO records are never left out: each answers one admin command (a swap, a rollback), so they cannot loop,
# and with one template for swaps and rollbacks a limit would hide which versions the instance served.
EVENT_LOGGERS = ("fastpath.swaps",)

_Key = tuple[str, int, str]  # logger name, level, message template


@dataclasses.dataclass
class _Window:
    start_s: float
    passed: int = 0
    left_out: int = 0
    example: str = ""  # the first left-out message, arguments filled in


class RepeatFilter(logging.Filter):
    """Lets the first ``max_per_window`` records of each (logger, level, message template) through per window.

    Args:
        emit: where the summary records go (the handler's ``handle``; they bypass this filter).
        max_per_window: records of one template that pass within one window, >= 1.
        window_s: the window in seconds, > 0; a template's window starts with its first record after the last one ended.
        clock: monotonic seconds (injected by tests).

    Raises:
        ValueError: ``max_per_window`` < 1 or ``window_s`` <= 0.
    """

    def __init__(self, emit: Callable[[logging.LogRecord], object], *, max_per_window: int = MAX_PER_WINDOW,
                 window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if max_per_window < 1 or window_s <= 0:
            raise ValueError(f"max_per_window must be >= 1 and window_s > 0, got {max_per_window} and {window_s}")
        self._emit, self._clock = emit, clock
        self.max_per_window, self.window_s = max_per_window, window_s
        self._windows: dict[_Key, _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "fastpath_summary", False) or (record.levelno == logging.INFO and _is_event(record.name)):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            window = self._windows.pop(key, None)
            summary = None
            if window is None or now - window.start_s >= self.window_s:
                summary = self._summary(key, window, now) if window is not None else None
                window = _Window(now)
            self._windows[key] = window  # re-inserted: the dict's order is least recently seen first
            if len(self._windows) > MAX_TEMPLATES:
                del self._windows[next(iter(self._windows))]
            passes = window.passed < self.max_per_window
            if passes:
                window.passed += 1
            else:
                window.left_out += 1
                window.example = window.example or record.getMessage()
        if summary is not None:
            self._emit(summary)
        return passes

    def flush(self) -> None:
        """Write the summary of every window that has ended with records left out, and forget those windows."""
        now = self._clock()
        with self._lock:
            ended = [(key, window) for key, window in self._windows.items() if now - window.start_s >= self.window_s]
            for key, _ in ended:
                del self._windows[key]
            summaries = [self._summary(key, window, now) for key, window in ended]
        for summary in summaries:
            if summary is not None:
                self._emit(summary)

    def _summary(self, key: _Key, window: _Window, now: float) -> logging.LogRecord | None:
        """The line saying how many of ``key``'s records ``window`` left out; None when it left out none."""
        if not window.left_out:
            return None
        name, level, _ = key
        summary = logging.LogRecord(name, level, __file__, 0, "the message %r was repeated %d more times in %.0f s and "
                                    "left out of the log (at most %d of one kind pass per %.0f s)",
                                    (window.example, window.left_out, now - window.start_s, self.max_per_window, self.window_s),
                                    None)
        summary.fastpath_summary = True
        return summary


def _is_event(name: str) -> bool:
    """Whether logger ``name`` is one of :data:`EVENT_LOGGERS` or below one."""
    return any(name == event or name.startswith(event + ".") for event in EVENT_LOGGERS)


_configured: list[RepeatFilter] = []


def configure_stub_logging() -> RepeatFilter:
    """Give the ``fastpath`` logger a stderr handler with a :class:`RepeatFilter` (once per process;
    later calls return the same filter), and the :data:`EVENT_LOGGERS` the INFO level unless they have one.
    Records of ``fastpath.*`` go to it alone, not to Python's last-resort handler."""
    if _configured:
        return _configured[0]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    repeat = RepeatFilter(handler.handle)
    handler.addFilter(repeat)
    logger = logging.getLogger("fastpath")
    logger.addHandler(handler)
    logger.propagate = False
    for name in EVENT_LOGGERS:
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.INFO)
    _configured.append(repeat)
    return repeat
