"""What the scheduled python-backend models share: request options, final sends, scheduler metrics.

``text_embedding`` and ``text_detection`` both return ``None`` from ``execute()`` and answer each
request later from the scheduler's threads through its response sender (verified on Triton 2.51,
docs/design/scheduler.md).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastpath.config import SchedulerConfig
from fastpath.errors import InvalidInputError
from fastpath.scheduling import SchedulerObserver

LOG = logging.getLogger(__name__)
PRIORITY_PARAMETER = "fastpath_priority"


def priority_level(request: Any, sched: SchedulerConfig) -> int:
    """Triton priority semantics from the ``fastpath_priority`` request parameter.

    Triton 2.51's python backend does not expose the request's own ``priority`` to the model, so
    FastPath reads this parameter: 1 = highest .. ``priority_levels``; 0, absent or out of range =
    ``default_priority_level``.

    Raises:
        InvalidInputError: the parameter is not an integer.
    """
    levels, default = sched.priority_levels, sched.default_priority_level
    raw = json.loads(request.parameters() or "{}").get(PRIORITY_PARAMETER)
    if raw is None or levels == 0:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidInputError(
            f"request parameter {PRIORITY_PARAMETER} = {raw!r}: expected an integer priority level "
            f"(1 = highest .. {levels}; 0 = default level {default})"
        )
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


def scheduler_metrics(pb_utils: Any, args: dict[str, str], sched: SchedulerConfig, default_model: str) -> SchedulerObserver:
    """Scheduler metrics on Triton's metrics port, or a no-op observer when the server has metrics off."""
    from fastpath.triton.metrics import SchedulerMetrics

    try:
        return SchedulerMetrics(pb_utils, model=args.get("model_name", default_model),
                                version=args["model_version"], batch_buckets=sched.batch_buckets)
    except Exception as exc:  # metrics disabled on the server (--allow-metrics=false): serve anyway
        LOG.warning("FastPath scheduler metrics are off: %s", exc)
        return SchedulerObserver()
