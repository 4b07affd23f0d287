"""Request options and answers of the scheduled models (:class:`~fastpath.triton.scheduled.ScheduledModel`).

Each ``execute()`` call's requests are answered from the scheduler's threads (:class:`Replies`):
through each request's response sender with ``execute()`` already returned (``response_mode=sender``,
verified on Triton 2.51), or collected and returned as ``execute()``'s list (``response_mode=return``);
docs/design/scheduler.md. Responses carry only the outputs the client requested (:func:`select_outputs`):
on Triton 2.51 a response sent through a response sender after ``execute()`` returned that also carries
outputs the client did not request kills the stub (docs/known-issues.md).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fastpath.errors import InvalidInputError, clipped
from fastpath.scheduling.config import SchedulerConfig
from fastpath.triton.heartbeat import Progress
from fastpath.triton.io import error_response

LOG = logging.getLogger(__name__)
PRIORITY_PARAMETER = "fastpath_priority"
# what a request parameter's JSON value is, for error messages (a client that sends "1" sees "a string")
JSON_KINDS = {str: "string", float: "floating-point number", bool: "boolean", list: "list", dict: "object"}


def priority_level(request: Any, sched: SchedulerConfig) -> int:
    """Triton priority semantics from the ``fastpath_priority`` request parameter.

    Triton 2.51's python backend does not expose the request's own ``priority`` to the model, so
    FastPath reads this parameter: 1 = highest .. ``priority_levels``; 0, absent or above the
    levels = ``default_priority_level`` (Triton's rule). It is checked even when priorities are
    off (``priority_levels`` = 0, every request at the default level), so a client's bad value is
    reported, not silently ignored.

    Raises:
        InvalidInputError: the parameter is not a non-negative integer (Triton's priority is unsigned).
    """
    levels, default = sched.priority_levels, sched.default_priority_level
    raw = json.loads(request.parameters() or "{}").get(PRIORITY_PARAMETER)
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        scale = (f"1 = highest .. {levels}; 0 = the default level {default}" if levels
                 else "priorities are off here (priority_levels = 0): every request runs at the default level")
        kind = ("a negative integer" if isinstance(raw, int) and not isinstance(raw, bool)
                 else f"a {JSON_KINDS.get(type(raw), type(raw).__name__)}")
        if isinstance(raw, float) and math.isfinite(raw) and raw >= 2.0**63:  # Triton keeps an integer past int64 as a double
            kind += " (if it was sent as an integer: one of 2^63 or more does not fit Triton's int64 parameter and arrives as a float)"
        raise InvalidInputError(f"request parameter {PRIORITY_PARAMETER} = {clipped(json.dumps(raw), 80)} is {kind}: expected a non-negative integer, "
                                f"sent as an integer parameter (int64_param over gRPC, a JSON number over HTTP) ({scale})")
    return raw if 1 <= raw <= levels else default


def request_timeout_s(request: Any, sched: SchedulerConfig) -> float | None:
    """The request's queue timeout in seconds (Triton ``timeout``, microseconds; else ``default_timeout_us``), or None."""
    timeout_us = request.timeout() or sched.default_timeout_us
    return timeout_us * 1e-6 if timeout_us else None


def send_final(pb_utils: Any, sender: Any, response: Any) -> None:
    """Send ``response`` as the request's only and final one; a failure (client gone) is logged."""
    try:
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    except Exception:  # the client is gone or the request was already answered: nothing else to do
        LOG.exception("sending a response failed")


def requested_outputs(request: Any) -> frozenset[str]:
    """Names of the outputs the client asked for; empty means all (Triton's default)."""
    return frozenset(request.requested_output_names())


def select_outputs(pb_utils: Any, tensors: Sequence[Any], wanted: frozenset[str]) -> Any:
    """An ``InferenceResponse`` holding the ``tensors`` (``pb_utils.Tensor``) in ``wanted``; all if it is empty."""
    return pb_utils.InferenceResponse(output_tensors=[t for t in tensors if not wanted or t.name() in wanted])


class Replies:
    """Where the answers of one ``execute()`` call go; every request gets exactly one.

    Args:
        pb_utils: ``triton_python_backend_utils``.
        requests: the call's requests, in order.
        mode: ``sender``: :meth:`answer` sends through the request's response sender at once and
            :meth:`result` returns None; ``return``: :meth:`answer` stores the response and
            :meth:`result` blocks until every request has one, then returns them in order.
        progress: the instance's liveness counters: the requests are accepted now, each answer counts.

    Raises:
        ValueError: an unknown ``mode``.
    """

    def __init__(self, pb_utils: Any, requests: Sequence[Any], mode: str, progress: Progress | None = None) -> None:
        if mode not in ("sender", "return"):
            raise ValueError(f"response mode {mode!r}: expected 'sender' or 'return'")
        self._pb = pb_utils
        self._mode = mode
        self._progress = progress
        if progress is not None:
            progress.accept(len(requests))
        self._senders = [r.get_response_sender() for r in requests] if mode == "sender" else []
        self._ids = [r.request_id() for r in requests]  # read now: a sender-mode request may be gone when it fails
        self._responses: list[Any] = [None] * len(requests)
        self._missing = len(requests)
        self._done = threading.Condition()

    def request_id(self, index: int) -> str:
        """Request ``index``'s id as the client sent it ("" without one), read when the call arrived."""
        return self._ids[index]

    def fail(self, index: int, error: BaseException) -> None:
        """Answer request ``index`` with ``error`` (:func:`~fastpath.triton.io.error_response`, its request id first)."""
        self.answer(index, error_response(self._pb, error, self._ids[index]))

    def answer(self, index: int, response: Any) -> None:
        """Request ``index``'s only response (``sender``: sent now; a send failure is logged). A second
        answer for one request is dropped and logged: Triton refuses a second final response of a
        non-decoupled request, and its request may already be released."""
        with self._done:
            if self._responses[index] is not None:
                LOG.error("request %d of an execute() call was answered twice; the later answer is dropped", index)
                return
            self._responses[index] = response if self._mode == "return" else True
            self._missing -= 1
            if not self._missing:
                self._done.notify_all()
        if self._progress is not None:
            self._progress.answer()
        if self._mode == "sender":
            send_final(self._pb, self._senders[index], response)

    def result(self) -> list[Any] | None:
        """What ``execute()`` returns: None (``sender``) or every response in request order (``return``)."""
        if self._mode == "sender":
            return None
        with self._done:
            self._done.wait_for(lambda: not self._missing)
            return list(self._responses)


def answer_counted(progress: Progress, requests: Sequence[Any], execute_call: Callable[[Sequence[Any]], list[Any]]) -> list[Any]:
    """``execute_call(requests)``, which returns one response per request, with the requests counted
    in ``progress`` (accepted now, answered when it returns or raises: Triton then answers them)."""
    progress.accept(len(requests))
    try:
        return execute_call(requests)
    finally:
        progress.answer(len(requests))
