"""Request options read from a python-backend request: fastpath_priority (Triton priority semantics)."""

import json
import re

import pytest

from fastpath.errors import InvalidInputError
from fastpath.scheduling.config import SchedulerConfig
from fastpath.triton.requests import priority_level


class Request:
    """The one method of pb_utils.InferenceRequest that priority_level reads."""

    def __init__(self, **parameters):
        self._parameters = json.dumps(parameters)

    def parameters(self):
        return self._parameters


@pytest.mark.parametrize(("value", "levels", "expected"), [(2, 3, 2), (1, 3, 1), (0, 3, 3), (7, 3, 3), (5, 0, 0), (10**12, 3, 3)])
def test_levels_follow_triton(value, levels, expected):
    sched = SchedulerConfig(priority_levels=levels, default_priority_level=3 if levels else 0)
    assert priority_level(Request(fastpath_priority=value), sched) == expected
    assert priority_level(Request(), sched) == sched.default_priority_level


@pytest.mark.parametrize(("value", "kind"), [(-1, "a negative integer"), (1.5, "a floating-point number"), ("x", "a string"),
                                           ("0", "a string"), (True, "a boolean"), ([1], "a list"),
                                           (2.0**63, "a floating-point number (if it was sent as an integer: one of 2^63 or "
                                                     "more does not fit Triton's int64 parameter and arrives as a float)"),
                                           (float("inf"), "a floating-point number"), (-(2.0**63), "a floating-point number")])
@pytest.mark.parametrize("levels", [0, 3])
def test_a_bad_priority_is_refused_even_when_priorities_are_off(value, kind, levels):
    sched = SchedulerConfig(priority_levels=levels, default_priority_level=1 if levels else 0)
    expected = f"fastpath_priority = {json.dumps(value)} is {kind}: expected a non-negative integer, sent as an integer parameter"
    with pytest.raises(InvalidInputError, match=re.escape(expected)):
        priority_level(Request(fastpath_priority=value), sched)


def test_a_long_bad_priority_is_quoted_cut_short():
    """A client's 50,000-character value: the message quotes 80 characters of it and says how long it was, so the
    error stays far below gRPC's 8 KiB header limit (past it the client gets a transport error instead)."""
    with pytest.raises(InvalidInputError) as caught:
        priority_level(Request(fastpath_priority="9" * 50_000), SchedulerConfig())
    message = str(caught.value)
    assert len(message) < 500 and "(cut; 50002 characters in all) is a string" in message
