"""RepeatFilter: a loop of one error cannot flood the stub's log (fastpath.triton.logs), on a fake clock."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest

from fastpath.triton.logs import RepeatFilter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged():
    """(logger, filter, clock, lines): a logger whose records pass a RepeatFilter (3 per 10 s) into ``lines``."""
    clock, stream = Clock(), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    repeat = RepeatFilter(handler.handle, max_per_window=3, window_s=10.0, clock=clock)
    handler.addFilter(repeat)
    logger = logging.getLogger("fastpath.test_stub_logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield logger, repeat, clock, lambda: stream.getvalue().splitlines()
    finally:
        logger.removeHandler(handler)


def test_a_loop_of_one_error_passes_the_first_n_then_one_line_counts_the_rest(logged):
    """Invariant: within one window at most max_per_window records of one (logger, level, template) pass;
    the next record after the window writes one summary line with the number left out, then passes."""
    logger, _, clock, lines = logged
    for thread in range(1000):
        logger.error("scheduler thread %s failed; continuing", f"t{thread}")
        clock.now += 0.001
    assert lines() == [f"fastpath.test_stub_logs ERROR scheduler thread t{n} failed; continuing" for n in range(3)]
    clock.now += 10.0
    logger.error("scheduler thread %s failed; continuing", "late")
    assert lines()[3:] == [
        "fastpath.test_stub_logs ERROR the message 'scheduler thread t3 failed; continuing' was repeated 997 more "
        "times in 11 s and left out of the log (at most 3 of one kind pass per 10 s)",
        "fastpath.test_stub_logs ERROR scheduler thread late failed; continuing",
    ]


def test_other_templates_levels_and_loggers_are_counted_apart(logged):
    logger, _, _, lines = logged
    other = logging.getLogger("fastpath.test_stub_logs.other")
    for _ in range(5):
        logger.error("engine failed: %s", "boom")
        logger.warning("engine failed: %s", "boom")
        logger.error("staging failed: %s", "full")
        other.error("engine failed: %s", "boom")  # propagates to the same handler, its own logger name
    assert len(lines()) == 4 * 3


def test_flush_writes_the_summary_of_an_ended_window_once_and_nothing_before_it_ends(logged):
    logger, repeat, clock, lines = logged
    for _ in range(7):
        logger.error("run failed")
    repeat.flush()
    assert len(lines()) == 3  # the window has not ended
    clock.now += 10.0
    repeat.flush()
    repeat.flush()
    assert lines()[3:] == ["fastpath.test_stub_logs ERROR the message 'run failed' was repeated 4 more times in 10 s "
                           "and left out of the log (at most 3 of one kind pass per 10 s)"]
    logger.error("run failed")  # a fresh window: passes, with no second summary
    assert lines()[4:] == ["fastpath.test_stub_logs ERROR run failed"]


def test_a_window_without_records_left_out_writes_no_summary(logged):
    logger, repeat, clock, lines = logged
    for _ in range(3):
        logger.error("once in a while")
        clock.now += 11.0
        repeat.flush()
    assert lines() == ["fastpath.test_stub_logs ERROR once in a while"] * 3


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="max_per_window must be >= 1"):
        RepeatFilter(print, max_per_window=0)
    with pytest.raises(ValueError, match="window_s > 0"):
        RepeatFilter(print, window_s=0)


def test_configured_stub_logging_writes_fastpath_records_to_stderr_with_the_filter():
    """In a fresh interpreter (as in a stub): a warning of a fastpath logger reaches stderr once with
    its logger name and level; 20 identical errors give 5 lines."""
    code = ("import logging\nfrom fastpath.triton.logs import configure_stub_logging\n"
            "assert configure_stub_logging() is configure_stub_logging()\n"
            "log = logging.getLogger('fastpath.models.x')\nlog.warning('hello %s', 'stub')\n"
            "[log.error('loop %d', i) for i in range(20)]\n")
    stderr = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr.splitlines()
    assert len(stderr) == 6
    assert stderr[0].endswith("fastpath WARNING fastpath.models.x: hello stub")
    assert [line.rsplit(": ", 1)[1] for line in stderr[1:]] == [f"loop {i}" for i in range(5)]


def test_a_swap_is_logged_at_info_while_other_info_records_stay_quiet():
    """In a fresh interpreter: the swap agent's INFO line (a version swap done) reaches stderr at the default
    verbosity, as Triton's own load lines do; an INFO record of another fastpath logger does not."""
    code = ("import logging\nfrom fastpath.triton.logs import configure_stub_logging\nconfigure_stub_logging()\n"
            "logging.getLogger('fastpath.swaps.agent').info('text_embedding_0_0: swap to version %s done', 2)\n"
            "logging.getLogger('fastpath.models.x').info('routine detail')\n")
    stderr = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr.splitlines()
    assert len(stderr) == 1 and stderr[0].endswith("fastpath INFO fastpath.swaps.agent: text_embedding_0_0: swap to version 2 done")


def test_swap_outcomes_at_info_are_never_left_out_while_a_looping_error_of_the_same_logger_is():
    """Each swap or rollback answers one admin command, and both share one template: invariant, every INFO
    record of the swaps loggers passes, so the log shows each version an instance served; an error of the
    same logger that loops (a failing poll) is still limited."""
    clock, stream = Clock(), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(RepeatFilter(handler.handle, max_per_window=3, window_s=10.0, clock=clock))
    logger = logging.getLogger("fastpath.swaps.test_stub_logs")
    logger.addHandler(handler)
    logger.propagate, logger.level = False, logging.INFO
    try:
        for n in range(8):
            logger.info("%s: %s to version %s done in %.3f s", "m_0_0", ("swap", "rollback")[n % 2], 1 + n % 2, 0.5)
            logger.error("swap agent %s: poll failed", "m_0_0")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert [line for line in lines if line.startswith("INFO")] == [
        f"INFO m_0_0: {('swap', 'rollback')[n % 2]} to version {1 + n % 2} done in 0.500 s" for n in range(8)]
    assert [line for line in lines if line.startswith("ERROR")] == ["ERROR swap agent m_0_0: poll failed"] * 3
