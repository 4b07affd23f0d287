"""gRPC ``async_infer`` callbacks collected by call index, to check that every call got exactly one answer."""

from __future__ import annotations

import functools
import threading
from typing import Any


class Callbacks:
    """``callbacks.for_call(i)`` is call ``i``'s callback; ``results[i]`` lists every (result, error) it received."""

    def __init__(self) -> None:
        self._done = threading.Condition()
        self.results: dict[int, list[tuple[Any, Any]]] = {}

    def for_call(self, index: int) -> functools.partial:
        return functools.partial(self._record, index)

    def _record(self, index: int, result: Any, error: Any) -> None:
        with self._done:
            self.results.setdefault(index, []).append((result, error))
            self._done.notify_all()

    def wait(self, calls: int, timeout_s: float) -> bool:
        """True once ``calls`` distinct calls have answered, False after ``timeout_s`` seconds."""
        with self._done:
            return self._done.wait_for(lambda: len(self.results) >= calls, timeout=timeout_s)
