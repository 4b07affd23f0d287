"""CostModel (EWMA per cell, linear fit for unmeasured cells) and Ticket (exactly one answer)."""

from __future__ import annotations

import threading

import pytest

from fastpath.scheduling import CostModel, Ticket
from fastpath.scheduling.costs import FLOOR_RISE, SHRINK_MEASUREMENTS


def test_cell_is_an_ewma_shrunk_toward_the_fit_by_its_measurement_count():
    costs = CostModel(0.5, prior_overhead_s=0.0, prior_per_token_s=1e-3)  # prior fit: (4, 32) -> 0.128 s
    costs.observe(4, 32, 1.0)
    costs.observe(4, 32, 2.0)
    assert costs.measured() == {(4, 32): pytest.approx(1.5)}
    assert costs.estimate(4, 32) == pytest.approx(0.128 + 2 / (2 + SHRINK_MEASUREMENTS) * (1.5 - 0.128))
    for _ in range(200):
        costs.observe(4, 32, 1.5)
    assert costs.estimate(4, 32) == pytest.approx(1.5, rel=0.02)  # a well-measured cell follows itself


def test_unmeasured_cells_use_the_linear_fit_of_all_measurements():
    costs = CostModel(0.2)
    overhead_s, per_token_s = 3e-3, 2e-5
    for batch, length in ((1, 16), (8, 32), (16, 64)):
        costs.observe(batch, length, overhead_s + per_token_s * batch * length)
    fit_overhead, fit_per_token = costs.linear()
    assert fit_overhead == pytest.approx(overhead_s, rel=1e-6)
    assert fit_per_token == pytest.approx(per_token_s, rel=1e-6)
    assert costs.estimate(64, 128) == pytest.approx(overhead_s + per_token_s * 64 * 128, rel=1e-6)


def test_prior_until_two_distinct_shapes_and_never_a_negative_slope():
    costs = CostModel(0.2, prior_overhead_s=1e-3, prior_per_token_s=1e-6)
    assert costs.estimate(2, 100) == pytest.approx(1e-3 + 2e-4)
    costs.observe(1, 16, 0.5)
    assert costs.linear() == (1e-3, 1e-6)  # one shape does not determine a line
    costs.observe(64, 256, 0.1)  # noise: the bigger batch measured faster
    assert costs.linear() == (1e-3, 1e-6)


def test_bad_alpha_is_refused():
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        CostModel(0.0)


def test_ticket_answers_once_with_rows_in_order(answers):
    ticket = Ticket(3, answers)
    ticket.set_row(2, "c")
    ticket.set_row(0, "a")
    assert answers.count(ticket) == 0 and not ticket.done
    ticket.set_row(1, "b")
    ticket.set_row(1, "again")
    assert ticket.fail(RuntimeError("late")) is False
    assert answers.of(ticket) == (["a", "b", "c"], None)


def test_ticket_first_error_wins_and_later_rows_are_ignored(answers):
    ticket = Ticket(2, answers)
    ticket.set_row(0, "a")
    error = RuntimeError("engine failed")
    assert ticket.fail(error) is True
    ticket.set_row(1, "b")
    assert ticket.fail(RuntimeError("second")) is False
    assert answers.of(ticket) == (None, error)


def test_ticket_answers_once_under_racing_threads(answers):
    tickets = [Ticket(2, answers) for _ in range(200)]
    barrier = threading.Barrier(3)

    def rows():
        barrier.wait()
        for ticket in tickets:
            ticket.set_row(0, 0)
            ticket.set_row(1, 1)

    def errors():
        barrier.wait()
        for ticket in tickets:
            ticket.fail(RuntimeError("x"))

    threads = [threading.Thread(target=f) for f in (rows, errors, rows)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(answers.count(ticket) == 1 for ticket in tickets)


def test_a_failing_callback_is_contained(caplog):
    def broken(*_):
        raise RuntimeError("sender is gone")

    ticket = Ticket(1, broken, label="req-7")
    ticket.set_row(0, 1.0)
    assert ticket.done and "answering req-7 failed" in caplog.text


def test_is_cancelled_asks_the_owner_and_survives_its_errors(answers):
    assert Ticket(1, answers, is_cancelled=lambda: True).is_cancelled() is True
    assert Ticket(1, answers).is_cancelled() is False

    def dead():
        raise RuntimeError("request released")

    assert Ticket(1, answers, is_cancelled=dead).is_cancelled() is False


def test_floor_ignores_contention_spikes_but_learns_a_lasting_slowdown():
    costs = CostModel(0.5)
    costs.observe(1, 16, 0.010)
    costs.observe(1, 16, 0.050)  # another process took the CPU during this call
    assert costs.measured() == {(1, 16): pytest.approx(0.030)}  # expected: what it costs now
    assert costs.measured(floor=True) == {(1, 16): pytest.approx(0.010 + FLOOR_RISE * 0.040)}
    for _ in range(300):  # the engine really became slower
        costs.observe(1, 16, 0.020)
    assert costs.measured(floor=True)[(1, 16)] == pytest.approx(0.020, rel=0.01)


def test_shape_decisions_use_the_floor_fit_and_timing_uses_the_expected_fit():
    costs = CostModel(1.0)
    for batch, length, seconds in ((1, 16, 0.002), (16, 64, 0.1042)):
        costs.observe(batch, length, seconds)
        costs.observe(batch, length, seconds + 0.010)  # every second call delayed by 10 ms of other load
    overhead, per_token = costs.linear(floor=True)
    assert overhead == pytest.approx(0.0004, abs=2e-4) and per_token == pytest.approx(1e-4, rel=0.05)
    assert costs.linear()[0] > overhead + 0.009  # expected times carry the per-call delay
def test_running_fit_sums_equal_a_full_recomputation():
    import random

    rng = random.Random(3)
    model = CostModel(0.3)
    for _ in range(3000):
        batch, length = rng.choice([1, 2, 4, 8, 16, 32, 64]), rng.choice([16, 32, 64, 128, 256])
        model.observe(batch, length, 1e-3 + 2e-7 * batch * length * rng.uniform(0.8, 1.5))
        for floor in (False, True):
            fresh = model._solve(model._full_sums(model._floor if floor else model._expected))
            running = model.linear(floor=floor)
            assert running == pytest.approx(fresh, rel=1e-9, abs=1e-15)
