"""MonotonicClock.wait_until must survive non-finite wake times (Condition.wait(inf) raises OverflowError)."""

import math
import threading

import pytest

from fastpath.scheduling.clock import MonotonicClock


@pytest.mark.parametrize("deadline_s", [math.inf, math.nan, 1e300])
def test_non_finite_or_huge_deadline_waits_for_notify_without_raising(deadline_s):
    condition = threading.Condition()
    waiting = threading.Event()

    def notifier():
        waiting.wait(5)
        with condition:
            condition.notify_all()

    thread = threading.Thread(target=notifier)
    thread.start()
    with condition:
        waiting.set()  # the notifier can only take the lock once wait() has released it
        MonotonicClock().wait_until(condition, deadline_s)
    thread.join(5)
    assert not thread.is_alive()
