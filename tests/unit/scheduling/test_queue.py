"""BatchQueue's rules on a fake clock: fill, deadline, delay, idle, priority, timeout, queue full,
drain, length buckets, and cost-decided pad-up vs cut vs wait."""

from __future__ import annotations

import pytest

from fastpath.errors import UnavailableError

from .conftest import CPU, GPU, make_queue, request, submit


def test_lone_text_runs_at_once_on_an_idle_engine(answers, clock):
    queue = make_queue(CPU)
    (item,) = submit(queue, clock, request(answers, [10]))
    decision = queue.next_batch(clock.now())
    assert decision.batch.rule == "idle"
    assert decision.batch.items == (item,)
    assert (decision.batch.batch_size, decision.batch.length) == (1, 16)  # pads to its length bucket
    assert len(queue) == 0


def test_full_largest_bucket_dispatches_even_when_waiting_would_pay(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=1.0)
    items = [submit(queue, clock, request(answers, [20]))[0] for _ in range(70)]
    decision = queue.next_batch(clock.now())
    assert decision.batch.rule == "full"
    assert decision.batch.items == tuple(items[:64])  # oldest first
    assert (decision.batch.batch_size, decision.batch.length) == (64, 32)
    assert len(queue) == 6


def _arrive_every(queue, clock, answers, gap_s, count, tokens=10):
    """Texts arriving ``gap_s`` apart while the engine is busy (arrival rates are learned from these)."""
    items = []
    for _ in range(count):
        items += submit(queue, clock, request(answers, [tokens]), engine_busy=True)
        clock.advance(gap_s)
    return items


def test_waits_for_a_fuller_batch_when_call_overhead_dominates_then_max_delay_fires(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=2e-3)
    start = clock.now()
    items = _arrive_every(queue, clock, answers, 1e-4, 3)
    decision = queue.next_batch(clock.now())
    assert decision.batch is None  # one more text is ~0.1 ms away and saves a 5 ms call: wait
    assert clock.now() < decision.wake_s <= start + 2e-3
    clock.advance(start + 2e-3 + 1e-9 - clock.now())  # no more arrivals until the oldest has waited 2 ms
    decision = queue.next_batch(clock.now())
    assert decision.batch.rule == "delay"
    assert decision.batch.items == tuple(items)
    assert decision.batch.batch_size == 4  # overhead-bound: pad 3 texts up to the 4 bucket with a filler row


def test_a_closed_loop_client_at_concurrency_1_is_never_kept_waiting(answers, clock):
    """Each text arrives to an empty queue and an idle engine (the client waits for its answer):
    those gaps teach no arrival rate, so even an overhead-bound engine runs every text at once."""
    queue = make_queue(GPU, max_queue_delay_s=1.0)
    for _ in range(5):
        (item,) = submit(queue, clock, request(answers, [10]))
        decision = queue.next_batch(clock.now())
        assert decision.batch.rule == "idle" and decision.batch.items == (item,)
        clock.advance(1e-4)


def test_cpu_does_not_wait_for_more_texts_at_a_realistic_arrival_rate(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=1.0)
    items = _arrive_every(queue, clock, answers, 5e-3, 3)  # 200 texts/s
    decision = queue.next_batch(clock.now())
    assert decision.batch.rule == "idle"
    assert decision.batch.items == tuple(items[:2])  # per-token bound: cut to 2 rather than a filler row


@pytest.mark.parametrize(("costs", "rows", "served"), [(CPU, 4, 4), (GPU, 8, 5)])
def test_pad_up_or_cut_is_decided_by_cost(answers, clock, costs, rows, served):
    queue = make_queue(costs, max_queue_delay_s=0.0)
    for _ in range(5):
        submit(queue, clock, request(answers, [16]))
    batch = queue.next_batch(clock.now()).batch
    assert (batch.batch_size, len(batch.items)) == (rows, served)
    assert len(queue) == 5 - served


def test_length_buckets_keep_a_long_text_out_of_a_short_batch(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=0.0)
    short = [submit(queue, clock, request(answers, [10]))[0] for _ in range(8)]
    (long,) = submit(queue, clock, request(answers, [100]))
    first = queue.next_batch(clock.now()).batch
    assert first.items == tuple(short) and first.length == 16
    second = queue.next_batch(clock.now()).batch
    assert second.items == (long,) and (second.batch_size, second.length) == (1, 128)


@pytest.mark.parametrize(("costs", "merged"), [(CPU, False), (GPU, True)])
def test_neighbour_buckets_merge_only_when_overhead_outweighs_padding(answers, clock, costs, merged):
    queue = make_queue(costs, max_queue_delay_s=0.0)
    for tokens in [10] * 8 + [20] * 8:
        submit(queue, clock, request(answers, [tokens]))
    batch = queue.next_batch(clock.now()).batch
    if merged:
        assert (len(batch.items), batch.length) == (16, 32)
    else:
        assert (len(batch.items), batch.length) == (8, 16)
        assert {item.tokens for item in batch.items} == {10}


def test_deadline_rule_runs_the_text_at_risk_first(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=1.0)
    _arrive_every(queue, clock, answers, 1e-3, 2)  # short texts, and an arrival rate that makes waiting pay
    (urgent,) = submit(queue, clock, request(answers, [100]), timeout_s=5.5e-3)
    decision = queue.next_batch(clock.now())
    assert decision.batch is None
    cost_s = queue.costs.estimate(1, 128)
    assert decision.wake_s == pytest.approx(urgent.deadline_s - cost_s)  # latest start that still meets it
    clock.advance(decision.wake_s - clock.now())
    batch = queue.next_batch(clock.now()).batch
    assert batch.rule == "deadline"
    assert batch.items[0] is urgent and batch.length == 128


def test_deadline_margin_moves_the_latest_start_earlier(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=1.0, deadline_margin_s=1e-3)
    _arrive_every(queue, clock, answers, 1e-3, 2)
    (urgent,) = submit(queue, clock, request(answers, [10]), timeout_s=20e-3)
    wake_s = queue.next_batch(clock.now()).wake_s
    assert wake_s <= urgent.deadline_s - queue.costs.estimate(4, 16) - 1e-3 + 1e-12


def test_timed_out_texts_leave_the_queue_as_expired(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=0.0)
    (late,) = submit(queue, clock, request(answers, [10]), timeout_s=1e-3)
    (patient,) = submit(queue, clock, request(answers, [10]))
    clock.advance(2e-3)
    decision = queue.next_batch(clock.now())
    assert decision.expired == (late,)
    assert decision.batch.items == (patient,)


def test_higher_priority_runs_first_and_lower_fills_the_rest(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=0.0, batch_sizes=(1, 2))
    low = [submit(queue, clock, request(answers, [10], priority_level=2))[0] for _ in range(3)]
    (high,) = submit(queue, clock, request(answers, [10], priority_level=1))
    assert queue.next_batch(clock.now()).batch.items == (high, low[0])
    assert queue.next_batch(clock.now()).batch.items == (low[1], low[2])


def test_full_queue_rejects_the_whole_request_as_unavailable(answers, clock):
    queue = make_queue(CPU, max_texts=64)
    submit(queue, clock, request(answers, [10] * 60))
    with pytest.raises(UnavailableError, match=r"Exceeds maximum queue size: 60 texts queued \+ 5 .*max_queue_texts=64") as info:
        submit(queue, clock, request(answers, [10] * 5))
    assert info.value.triton_code == "UNAVAILABLE"
    assert len(queue) == 60  # all or nothing
    submit(queue, clock, request(answers, [10] * 4))  # what fits is still accepted


def test_closed_queue_rejects_new_texts_and_drains_without_waiting(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=1.0)
    items = _arrive_every(queue, clock, answers, 1e-4, 3)
    assert queue.next_batch(clock.now()).batch is None  # would wait for a fuller batch
    queue.close()
    with pytest.raises(UnavailableError, match="shutting down"):
        submit(queue, clock, request(answers, [10]))
    batch = queue.next_batch(clock.now()).batch
    assert batch.rule == "drain" and batch.items == tuple(items)


def test_texts_of_an_answered_ticket_are_dropped(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=0.0)
    first, second = submit(queue, clock, request(answers, [10, 200]))
    first.ticket.fail(RuntimeError("its other batch failed"))
    decision = queue.next_batch(clock.now())
    assert decision.batch is None and decision.expired == () and len(queue) == 0


def test_bucket_lists_are_validated():
    with pytest.raises(ValueError, match="batch_sizes must start at 1"):
        make_queue(batch_sizes=(2, 4))
    with pytest.raises(ValueError, match="length_buckets = 32,16: expected a strictly increasing"):
        make_queue(length_buckets=(32, 16))


def test_min_padding_gain_keeps_a_modest_predicted_gain_from_buying_padding(answers, clock):
    """GPU costs predict ~2x efficiency from merging 8 + 8 texts into one 32-token batch: a 1.5x
    threshold merges, a 3x threshold keeps the padding-free batch."""
    for gain, merged in ((1.5, True), (3.0, False)):
        queue = make_queue(GPU, max_queue_delay_s=0.0, min_padding_gain=gain)
        for tokens in [10] * 8 + [20] * 8:
            submit(queue, clock, request(answers, [tokens]))
        batch = queue.next_batch(clock.now()).batch
        assert (len(batch.items), batch.length) == ((16, 32) if merged else (8, 16))


def test_pad_to_longest_pads_a_batch_to_its_longest_text_not_its_bucket(clock, answers):
    """Engines that run any shape (ONNX Runtime on the CPU) pad to the longest text; others to the bucket."""
    for pad_to_longest, length in ((True, 13), (False, 16)):
        queue = make_queue(CPU, max_queue_delay_s=0.0, pad_to_longest=pad_to_longest)
        submit(queue, clock, request(answers, [10, 13, 11, 12]))
        batch = queue.next_batch(clock.now()).batch
        assert (len(batch.items), batch.length, batch.padded_tokens) == (4, length, 4 * length)


@pytest.mark.parametrize("order", [(4, 224), (224, 4)])
def test_a_short_text_does_not_ride_along_with_a_long_one_whatever_the_order(answers, clock, order):
    """A request [4-token, 224-token] and its reverse both run as two batches on a CPU, not one batch
    padded to 224 (0.49 padding, ~2x the latency): merging must beat running each bucket's texts on
    their own, not just the short anchor's tiny batch."""
    queue = make_queue(CPU, max_queue_delay_s=0.0, min_padding_gain=1.1)
    submit(queue, clock, request(answers, list(order)))
    first = queue.next_batch(clock.now(), flush=True).batch
    second = queue.next_batch(clock.now(), flush=True).batch
    assert sorted((len(b.items), b.length) for b in (first, second)) == [(1, 16), (1, 256)]


def test_with_per_call_overhead_a_short_text_still_joins_a_long_batch(answers, clock):
    """On a GPU (call overhead >> tokens) one padded call is cheaper than two: the merge stays."""
    queue = make_queue(GPU, max_queue_delay_s=0.0, min_padding_gain=1.1)
    submit(queue, clock, request(answers, [4, 224]))
    batch = queue.next_batch(clock.now(), flush=True).batch
    assert (len(batch.items), batch.length) == (2, 256)


def test_a_started_request_does_not_time_out_between_its_batches(answers, clock):
    """Triton's timeout covers the wait before execution: once one text of a request ran, the rest
    is not expired (a lone [4, 224]-token request with a 2-30 ms timeout succeeds on an idle server)."""
    queue = make_queue(CPU, max_queue_delay_s=0.0)
    items = submit(queue, clock, request(answers, [4, 224]), timeout_s=2e-3)
    first = queue.next_batch(clock.now(), flush=True)
    assert len(first.batch.items) == 1 and not first.expired  # the two never share a batch on a CPU
    clock.advance(40e-3)  # the first batch ran past the request's timeout
    second = queue.next_batch(clock.now(), flush=True)
    assert second.expired == () and set(first.batch.items + second.batch.items) == set(items)


@pytest.mark.parametrize("pad_to_longest", [False, True])
@pytest.mark.parametrize("tokens", [3, 16, 17, 200, 300])
@pytest.mark.parametrize("timeout_s", [None, 1.0, 1e-4])
def test_a_lone_flushed_text_forms_the_batch_the_full_rules_would(answers, clock, pad_to_longest, tokens, timeout_s):
    """next_batch(flush=True) with one queued text skips ranking candidates (the c=1 inline path's
    plan); its batch must equal what the rules form: one row at its bucket (or its own) length, the
    rule 'deadline' when its timeout is at risk, else 'drain'."""
    batches = []
    for shortcut in (True, False):
        queue = make_queue(CPU, pad_to_longest=pad_to_longest)
        (item,) = submit(queue, clock, request(answers, [tokens]), timeout_s=timeout_s)
        if shortcut:
            batch = queue.next_batch(clock.now(), flush=True).batch
        else:  # the general rules, as the policy applies them to a backlog
            batch = queue.policy.decide(queue, clock.now(), flush=True)
        assert len(queue) == 0 and item.ticket.started and batch.items == (item,)
        batches.append((batch.batch_size, batch.length, batch.rule, batch.predicted_s))
    assert batches[0] == batches[1]
    assert batches[0][2] == ("deadline" if timeout_s == 1e-4 else "drain")


# Sustained load (8 clients keeping one length bucket full with 64-text requests) must not starve other
# texts: a lone text of another length, a timed one, and a priority-1 one each run within a few batches,
# not when the load stops (41 s, an expiry, 31 s without the rules below).

def _keep_full(queue, clock, answers, tokens=20, priority_level=0):
    """Refill one length bucket to a full largest batch (sustained load of 64-text requests)."""
    queued = sum(1 for bucket in queue.buckets() for item in bucket.items if item.tokens == tokens)
    missing = queue.policy.batch_sizes.largest - queued
    return submit(queue, clock, request(answers, [tokens] * missing, priority_level=priority_level)) if missing > 0 else []


def test_a_bucket_kept_full_does_not_starve_an_older_text_of_another_length(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=2e-3)
    _keep_full(queue, clock, answers)
    (lone,) = submit(queue, clock, request(answers, [4]))
    ran = []
    for _ in range(4):
        _keep_full(queue, clock, answers)
        batch = queue.next_batch(clock.now()).batch
        ran.append(batch)
        clock.advance(batch.predicted_s)  # the engine runs it; more load arrives meanwhile
    lone_batch = next(b for b in ran if lone in b.items)
    assert ran.index(lone_batch) <= 2 and lone_batch.rule == "delay"  # served once it is the oldest waiting


def test_a_full_bucket_of_a_worse_priority_level_does_not_pass_a_better_text(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=1.0)  # not overdue: only priority decides
    _keep_full(queue, clock, answers, priority_level=2)
    (urgent,) = submit(queue, clock, request(answers, [4], priority_level=1))
    batch = queue.next_batch(clock.now()).batch
    assert urgent in batch.items and batch.rule != "full"


def test_a_timed_text_runs_before_a_batch_that_would_outlast_its_deadline(answers, clock):
    """A 64-text batch runs ~0.13 s here: a text whose timeout ends within it must go first, not
    expire behind it."""
    queue = make_queue(CPU, max_queue_delay_s=1.0)
    _keep_full(queue, clock, answers)
    (timed,) = submit(queue, clock, request(answers, [4]), timeout_s=0.1)
    batch = queue.next_batch(clock.now()).batch
    assert batch.rule == "deadline" and timed in batch.items
    (relaxed,) = submit(queue, clock, request(answers, [4]), timeout_s=10.0)
    _keep_full(queue, clock, answers)
    batch = queue.next_batch(clock.now()).batch
    assert batch.rule == "full" and relaxed not in batch.items  # time to spare: the full batch first


def test_a_burst_of_requests_spread_over_buckets_finishes_roughly_in_arrival_order(answers, clock):
    """12 requests of 64 texts over two length buckets, 50 ms apart, on one engine finish roughly in
    arrival order, not all 12 together at the end (each request's last texts waiting in a bucket that is
    not full)."""
    queue = make_queue(CPU, max_queue_delay_s=2e-3)
    requests = []
    finished: dict[int, float] = {}
    pending, next_arrival = 12, clock.now()
    while pending:
        while requests.__len__() < 12 and next_arrival <= clock.now():
            tokens = [20] * 60 + [100] * 4  # most texts in one bucket, a few in a bucket that never fills
            requests.append(submit(queue, clock, request(answers, tokens)))
            next_arrival += 50e-3
        batch = queue.next_batch(clock.now()).batch
        if batch is None:
            clock.advance(max(next_arrival - clock.now(), 1e-4))
            continue
        clock.advance(batch.predicted_s)
        for item in batch.items:
            item.ticket.set_row(item.row, item.tokens)
        for index, items in enumerate(requests):
            if index not in finished and items[0].ticket.done:
                finished[index] = clock.now()
                pending -= 1
    order = sorted(finished, key=finished.get)
    assert order.index(0) <= 2 and order.index(11) >= 8  # first in, among the first out; last in, among the last
    assert finished[0] < finished[11] - 0.5  # not all at once
