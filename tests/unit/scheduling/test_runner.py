"""BatchRunner's threads on a fake clock: exactly one answer per request, engine-error isolation,
cancellation, timeout, shutdown drain, and the stage/run pipeline. No sleeps: the tests block on
conditions and events, and move time with FakeClock.advance."""

from __future__ import annotations

import random
import threading

import pytest

from fastpath.errors import EngineError, UnavailableError
from fastpath.scheduling import BatchRunner, QueueTimeoutError, RequestCancelledError, SchedulerObserver

from .conftest import CPU, make_queue, request

RUN_S = 1e-3  # fake engine time per batch


class Handler:
    """Stage/run/finish that record what they saw; ``run`` can be gated and can fail."""

    def __init__(self, clock):
        self.clock = clock
        self.staged, self.ran = [], []
        self.gate: threading.Event | None = None
        self.fail_when = lambda batch: False
        self.changed = threading.Condition()

    def stage(self, batch):
        with self.changed:
            self.staged.append(batch)
            self.changed.notify_all()
        return batch

    def run(self, batch):
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        self.clock.advance(RUN_S)
        if self.fail_when(batch):
            raise EngineError(f"engine failed on a batch of {len(batch.items)}")
        with self.changed:
            self.ran.append(batch)
            self.changed.notify_all()
        return [item.tokens * 2 for item in batch.items] + [None] * (batch.batch_size - len(batch.items))

    def finish(self, batch, outputs):
        for index, item in enumerate(batch.items):
            item.ticket.set_row(item.row, outputs[index])

    def wait_staged(self, count):
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.staged) >= count, timeout=10)


class Recorder(SchedulerObserver):
    def __init__(self):
        self.rejections, self.delays = [], []

    def dispatched(self, batch, queue_delays_s):
        self.delays += list(queue_delays_s)

    def rejected(self, reason, texts):
        self.rejections.append((reason, texts))


@pytest.fixture
def handler(clock):
    return Handler(clock)


@pytest.fixture
def runner(clock, handler):
    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=0.0, max_texts=256), handler, clock=clock,
                         observer=Recorder(), stage_lead_s=1e-3)
    runner.start()
    yield runner
    if handler.gate is not None:
        handler.gate.set()
    runner.close(drain_timeout_s=10)


def test_every_request_gets_exactly_one_answer_with_its_rows(runner, answers):
    """Invariant: every accepted request gets exactly one answer, with its own rows; a request the full
    queue refuses (UnavailableError at submit, when the engine falls behind 4 submitting threads) gets none."""
    rng = random.Random(3)
    requests = [request(answers, [rng.choice([5, 14, 30, 60, 120, 250]) for _ in range(rng.randint(1, 4))], label=str(i))
                for i in range(120)]
    refused = []

    def submit(part):
        for items in part:
            try:
                runner.submit(items)
            except UnavailableError:
                refused.append(items)

    threads = [threading.Thread(target=submit, args=(requests[k::4],)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    accepted = [items for items in requests if not any(items is other for other in refused)]
    answers.wait_for(len(accepted))
    for items in accepted:
        ticket = items[0].ticket
        assert answers.count(ticket) == 1
        assert answers.of(ticket) == ([item.tokens * 2 for item in items], None)
    assert all(answers.count(items[0].ticket) == 0 for items in refused)
    assert len(accepted) >= len(requests) // 2  # the bound refuses only under a backlog, not every request


def test_an_engine_error_fails_only_the_requests_of_that_batch(runner, handler, answers):
    handler.fail_when = lambda batch: batch.length == 256
    split = request(answers, [10, 200], label="split")  # its long text lands in the failing batch
    runner.submit(split)
    answers.wait_for(1)
    results, error = answers.of(split[0].ticket)
    assert results is None and isinstance(error, EngineError) and "engine failed" in str(error)
    fine = request(answers, [10, 20], label="fine")
    runner.submit(fine)
    answers.wait_for(2)
    assert answers.of(fine[0].ticket) == ([20, 40], None)
    assert answers.count(split[0].ticket) == 1


def test_a_cancelled_request_is_answered_cancelled_and_never_runs(runner, handler, answers):
    handler.gate = threading.Event()
    first = request(answers, [10], label="first")
    runner.submit(first)
    handler.wait_staged(1)
    cancelled = request(answers, [10], cancelled=lambda: True, label="cancelled")
    runner.submit(cancelled)
    handler.gate.set()
    answers.wait_for(2)
    results, error = answers.of(cancelled[0].ticket)
    assert results is None and isinstance(error, RequestCancelledError) and error.triton_code == "CANCELLED"
    assert all(cancelled[0] not in batch.items for batch in handler.staged)
    assert ("cancelled", 1) in runner.observer.rejections


@pytest.mark.parametrize("waited_s, asked", [(0.0, False), (20e-3, True)])
def test_only_requests_that_waited_cancel_check_after_s_are_asked(clock, handler, answers, waited_s, asked):
    """cancel_check_after_s = 10 ms: a cancelled request whose batch forms sooner is not asked (each
    ask is a stub-to-server round trip) and runs; one that waited 20 ms is asked and answered CANCELLED."""
    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=0.0), handler, clock=clock, observer=Recorder(),
                         stage_lead_s=1e-3, cancel_check_after_s=10e-3).start()
    try:
        handler.gate = threading.Event()
        runner.submit(request(answers, [10], label="running"))
        handler.wait_staged(1)
        asks = []
        cancelled = request(answers, [10], cancelled=lambda: asks.append(clock.now()) or True, label="cancelled")
        runner.submit(cancelled)
        clock.advance(waited_s)  # the next batch forms once the running one nears its predicted end
        handler.gate.set()
        answers.wait_for(2)
        results, error = answers.of(cancelled[0].ticket)
        if asked:
            assert len(asks) == 1 and isinstance(error, RequestCancelledError) and results is None
            assert ("cancelled", 1) in runner.observer.rejections
        else:
            assert asks == [] and error is None and results == [20]
    finally:
        handler.gate.set()
        runner.close(drain_timeout_s=10)


def test_a_request_still_queued_at_its_timeout_gets_unavailable(runner, handler, answers, clock):
    handler.gate = threading.Event()
    runner.submit(request(answers, [10], label="running"))
    handler.wait_staged(1)
    late = request(answers, [10], label="late")
    runner.submit(late, timeout_s=5e-3)
    clock.advance(10e-3)
    handler.gate.set()
    answers.wait_for(2)
    results, error = answers.of(late[0].ticket)
    assert isinstance(error, QueueTimeoutError) and error.triton_code == "UNAVAILABLE"
    assert "Request timeout expired" in str(error) and "timeout is 5000 us" in str(error)
    assert ("timeout", 1) in runner.observer.rejections


def test_a_request_timing_out_while_the_engine_is_busy_is_answered_at_its_timeout(runner, handler, answers, clock):
    """A 1 ms timeout under load is answered at its timeout, not 1.4 s late at the next batch: the
    stager wakes at the queue's next expiry, so the 503 goes out while the engine still runs."""
    handler.gate = threading.Event()  # the running batch never ends during this test
    running = request(answers, [200] * 64, label="running")
    runner.submit(running)  # predicted to run ~1.6 s
    handler.wait_staged(1)
    assert handler.staged[0].predicted_s > 1.0
    late = request(answers, [10], label="late")
    runner.submit(late, timeout_s=5e-3)
    clock.advance(6e-3)
    answers.wait_for(1, timeout_s=5.0)  # the gate holds the engine for 10 s
    results, error = answers.of(late[0].ticket)
    assert isinstance(error, QueueTimeoutError) and answers.count(running[0].ticket) == 0  # the engine is still busy
    assert ("timeout", 1) in runner.observer.rejections
    handler.gate.set()
    answers.wait_for(2)


def test_the_next_batch_is_formed_late_and_staged_while_the_engine_runs(runner, handler, answers, clock):
    handler.gate = threading.Event()
    runner.submit(request(answers, [10], label="n"))
    handler.wait_staged(1)  # batch N is running (blocked in the engine)
    runner.submit(request(answers, [10], label="n+1 early"))
    assert len(handler.staged) == 1  # N is predicted to run ~3.6 ms: too early to form N+1
    runner.submit(request(answers, [10], label="n+1 late"))
    clock.advance(handler.staged[0].predicted_s)  # N's predicted end is now within stage_lead_s
    handler.wait_staged(2)
    assert not handler.ran  # staged while the engine still runs N
    assert [item.ticket.label for item in handler.staged[1].items] == ["n+1 early", "n+1 late"]
    handler.gate.set()
    answers.wait_for(3)


def test_a_submit_wakes_the_threads_only_when_one_can_act_before_its_next_timed_wake_up(runner, handler, answers, clock):
    handler.gate = threading.Event()
    runner.submit(request(answers, [10], label="n"))
    handler.wait_staged(1)  # the only lane runs N; the stager sleeps until stage_lead_s before N's predicted end
    wakes = []
    notify_all = runner._cond.notify_all
    runner._cond.notify_all = lambda: (wakes.append(clock.now()), notify_all())
    runner.submit(request(answers, [10], label="no timeout"))
    assert wakes == []  # nothing can use the text before the stager's timed wake-up
    runner.submit(request(answers, [10], label="timed"), timeout_s=5.0)
    assert len(wakes) == 1  # a timeout may pull the stager's next wake-up earlier
    clock.advance(handler.staged[0].predicted_s)  # past the lead point: the stager stages N+1
    handler.wait_staged(2)
    assert [item.ticket.label for item in handler.staged[1].items] == ["no timeout", "timed"]
    handler.gate.set()
    answers.wait_for(3)
    runner._cond.notify_all = notify_all


def test_close_drains_queued_requests_with_real_results(runner, handler, answers):
    handler.gate = threading.Event()
    requests = [request(answers, [10 * (k + 1)], label=str(k)) for k in range(5)]
    for items in requests:
        runner.submit(items)
    closer = threading.Thread(target=runner.close, kwargs={"drain_timeout_s": 60})
    closer.start()
    handler.gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert [answers.of(items[0].ticket) for items in requests] == [([item.tokens * 2], None) for (item,) in requests]
    with pytest.raises(UnavailableError, match="shutting down"):
        runner.submit(request(answers, [10]))
    assert ("shutdown", 1) in runner.observer.rejections


def test_close_answers_what_did_not_finish_within_the_drain_timeout(runner, handler, answers, clock):
    handler.gate = threading.Event()
    stuck, queued = request(answers, [10], label="stuck"), request(answers, [200], label="queued")
    runner.submit(stuck)
    handler.wait_staged(1)
    runner.submit(queued)
    closer = threading.Thread(target=runner.close, kwargs={"drain_timeout_s": 1.0})
    closer.start()
    while closer.is_alive():  # the closer waits on the fake clock: move it past the drain timeout
        clock.advance(0.5)
        closer.join(0.05)
    for items in (stuck, queued):
        results, error = answers.of(items[0].ticket)
        assert isinstance(error, UnavailableError) and "drain_timeout_s=1.0" in str(error)
    handler.gate.set()  # the stuck batch finishes late: its result is dropped, not sent twice
    assert answers.count(stuck[0].ticket) == 1


def test_queue_full_is_reported_and_raised(clock, handler, answers):
    recorder = Recorder()
    runner = BatchRunner(make_queue(CPU, max_texts=64), handler, clock=clock, observer=recorder)
    runner.submit(request(answers, [10] * 64))
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
        runner.submit(request(answers, [10]))
    assert recorder.rejections == [("queue_full", 1)]
    runner.start()
    runner.close(drain_timeout_s=10)
    answers.wait_for(1)


def test_queue_delay_is_measured_on_the_injected_clock(clock, handler, answers):
    recorder = Recorder()
    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=0.0), handler, clock=clock, observer=recorder)
    runner.submit(request(answers, [10]))
    clock.advance(0.25)  # not started yet: the text waits a quarter second of fake time
    runner.start()
    answers.wait_for(1)
    runner.close()
    assert recorder.delays == [pytest.approx(0.25)]


class _Exploding(Recorder):
    """An observer whose hooks raise, as a broken metrics backend would."""

    def __init__(self, where):
        super().__init__()
        self.where = where

    def dispatched(self, batch, queue_delays_s):
        if self.where == "dispatched":
            raise RuntimeError("metrics backend is down (dispatched)")

    def batch_done(self, batch, seconds, error):
        if self.where == "batch_done":
            raise RuntimeError("metrics backend is down (batch_done)")


@pytest.mark.parametrize("where", ["dispatched", "batch_done"])
def test_a_failing_hook_costs_no_answer_and_never_wedges_the_pipeline(clock, handler, answers, where):
    """A hook that raises while a batch is staged or delivered must not leave the runner waiting
    forever (the stager and engine thread each wait for the other's staging to end)."""
    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=0.0, max_texts=256), handler, clock=clock,
                         observer=_Exploding(where), stage_lead_s=1e-3).start()
    try:
        first = request(answers, [10], label="first")
        runner.submit(first)
        answers.wait_for(1)
        results, error = answers.of(first[0].ticket)
        if where == "dispatched":  # the batch fails with the hook's error, answered once
            assert results is None and "metrics backend is down" in str(error)
        else:  # delivery goes on: the rows arrive
            assert (results, error) == ([20], None)
        second = request(answers, [12, 30], label="second")
        runner.submit(second)
        answers.wait_for(2)
        assert answers.count(second[0].ticket) == 1
    finally:
        runner.close(drain_timeout_s=5)
    assert runner._idle()


def test_drain_inline_runs_every_queued_text_on_the_calling_thread(clock, handler, answers):
    """response_mode=return: no runner threads; the caller runs the queue's batches and every ticket is answered."""
    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=1.0, max_texts=256), handler, clock=clock, observer=Recorder())
    requests = [request(answers, tokens, label=str(i)) for i, tokens in enumerate([[10], [12, 200], [30, 31, 60], [250]])]
    for items in requests:
        runner.submit(items)
    caller = threading.current_thread()
    ran_on = []
    run = handler.run
    handler.run = lambda batch: (ran_on.append(threading.current_thread()), run(batch))[1]
    runner.drain_inline()
    assert len(answers.calls) == len(requests) and ran_on and set(ran_on) == {caller}
    for items in requests:
        assert answers.of(items[0].ticket) == ([item.tokens * 2 for item in items], None)
    assert len(runner.queue) == 0 and runner._idle()
    assert {batch.rule for batch in handler.ran} == {"drain"}  # max_queue_delay 1 s never waited for
    with pytest.raises(RuntimeError, match="never started"):
        runner.start().drain_inline()
    runner.close(drain_timeout_s=1)


class LaneHandler(Handler):
    """A Handler whose ``run`` takes a lane, records it, and blocks on a semaphore so batches overlap."""

    def __init__(self, clock):
        super().__init__(clock)
        self.permits = threading.Semaphore(0)
        self.lanes_seen: list[int | None] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def run(self, batch, lane=None):
        with self.changed:
            self.lanes_seen.append(lane)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.changed.notify_all()
        assert self.permits.acquire(timeout=10), "test never let the batch finish"
        with self.changed:
            self.in_flight -= 1
            self.ran.append(batch)
            self.changed.notify_all()
        return [item.tokens * 2 for item in batch.items] + [None] * (batch.batch_size - len(batch.items))

    def wait_running(self, count):
        with self.changed:
            assert self.changed.wait_for(lambda: self.in_flight >= count, timeout=10)


def test_lanes_run_batches_side_by_side_and_a_lone_batch_runs_wide(clock, answers):
    """Two lanes take batches from one queue at once; a batch alone (after LANES_LINGER_S) gets lane None."""
    from fastpath.scheduling.runner import LANES_LINGER_S

    handler = LaneHandler(clock)
    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=0.0), handler, clock=clock, observer=Recorder(), lanes=2)
    assert [t.name for t in runner._threads] == ["fastpath-stage", "fastpath-engine0", "fastpath-engine1", "fastpath-completion"]
    runner.start()
    try:
        first = request(answers, [10], label="first")
        runner.submit(first)
        handler.wait_running(1)
        second = request(answers, [200], label="second")
        runner.submit(second)
        handler.wait_running(2)  # the second lane took the second batch while the first still runs
        assert handler.most_in_flight == 2 and handler.lanes_seen[0] is None and handler.lanes_seen[1] in (0, 1)
        handler.permits.release(2)
        answers.wait_for(2)
        assert answers.of(first[0].ticket) == ([20], None) and answers.of(second[0].ticket) == ([400], None)
        runner.submit(request(answers, [12], label="soon after"))  # within the linger: still a lane
        handler.wait_running(1)
        handler.permits.release()
        answers.wait_for(3)
        clock.advance(LANES_LINGER_S)
        runner.submit(request(answers, [12], label="later"))  # alone, the linger over: wide again
        handler.wait_running(1)
        handler.permits.release()
        answers.wait_for(4)
        assert handler.lanes_seen[2] in (0, 1) and handler.lanes_seen[3] is None
    finally:
        handler.permits.release(8)
        runner.close(drain_timeout_s=5)
    with pytest.raises(ValueError, match="lanes must be >= 1"):
        BatchRunner(make_queue(CPU), handler, clock=clock, lanes=0)


def test_an_idle_runner_can_be_claimed_for_one_inline_call(clock, handler, answers):
    """inline_when_idle: claim_idle() succeeds only after INLINE_MIN_IDLE_S of idleness; while claimed the
    caller runs the queue's batches itself (the threads keep off); busy runners are not claimed."""
    from fastpath.scheduling.inline import INLINE_MIN_IDLE_S

    runner = BatchRunner(make_queue(CPU, max_queue_delay_s=1.0), handler, clock=clock, observer=Recorder()).start()
    caller = threading.current_thread()
    ran_on = []
    run = handler.run
    handler.run = lambda batch: (ran_on.append(threading.current_thread()), run(batch))[1]
    try:
        assert runner.claim_idle() and not runner.claim_idle()  # one claim at a time
        items = request(answers, [10, 40], label="inline")
        runner.submit(items)
        runner.drain_inline()
        runner.release_inline()
        assert answers.of(items[0].ticket) == ([20, 80], None) and set(ran_on) == {caller}
        assert not runner.claim_idle()  # the last answer was just now: requests may be waiting in Triton
        clock.advance(2 * INLINE_MIN_IDLE_S)
        assert runner.claim_idle()
        runner.release_inline()
        handler.gate = threading.Event()  # the threads' own batch, held in the engine
        clock.advance(2 * INLINE_MIN_IDLE_S)
        runner.submit(request(answers, [10], label="threads"))
        handler.wait_staged(2)
        assert not runner.claim_idle()  # busy
        handler.gate.set()
        answers.wait_for(2)
        assert ran_on[-1] is not caller
    finally:
        if handler.gate is not None:
            handler.gate.set()
        runner.close(drain_timeout_s=5)
    assert not runner.claim_idle()  # closed


def test_check_room_refuses_before_preparation_and_counts_the_rejection(clock, handler, answers):
    """text_detection asks before decoding a request's images (with decoding first, queue-full 503s
    would come 5-20 s late); the answer is submit's own."""
    runner = BatchRunner(make_queue(CPU, max_texts=4), handler, clock=clock, observer=Recorder())
    runner.submit(request(answers, [10, 10, 10]))
    runner.check_room(1)  # room for one more
    with pytest.raises(UnavailableError, match=r"Exceeds maximum queue size: 3 texts queued \+ 2 in this request"):
        runner.check_room(2)
    assert runner.observer.rejections == [("queue_full", 2)]
    runner.close(drain_timeout_s=0.0)


def test_a_full_queue_answers_its_cancelled_requests_and_takes_the_new_one(clock, handler, answers):
    """Requests whose clients cancelled hold their queue room until a batch forms, and a long batch would turn
    new requests away meanwhile. Invariant: a full queue asks its requests that waited cancel_check_after_s
    (oldest first, not the younger ones) whether they were cancelled, answers each cancelled one exactly once
    (CANCELLED), frees its room and accepts the new request; asks again only after CANCEL_SWEEP_INTERVAL_S."""
    from fastpath.scheduling.answers import CANCEL_SWEEP_INTERVAL_S

    asked: list[str] = []

    def probe(label: str, cancelled: bool):
        return lambda: asked.append(label) or cancelled

    runner = BatchRunner(make_queue(CPU, max_texts=4), handler, clock=clock, observer=Recorder(), cancel_check_after_s=0.25)
    gone = request(answers, [10, 10], cancelled=probe("gone", True), label="gone")
    kept = request(answers, [10], cancelled=probe("kept", False), label="kept")
    runner.submit(gone)
    runner.submit(kept)
    clock.advance(0.3)
    young = request(answers, [10], cancelled=probe("young", True), label="young")
    runner.submit(young)  # full now: 4 of 4
    runner.check_room(2)  # room after the sweep: the cancelled request's two texts left
    assert asked == ["gone", "kept"] and len(runner.queue) == 2
    assert answers.count(gone[0].ticket) == 1 and isinstance(answers.of(gone[0].ticket)[1], RequestCancelledError)
    assert runner.observer.rejections == [("cancelled", 2)]
    runner.submit(request(answers, [10, 10], label="new"))
    clock.advance(0.1)  # the next sweep is not due yet
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
        runner.check_room(1)
    assert asked == ["gone", "kept"] and runner.observer.rejections == [("cancelled", 2), ("queue_full", 1)]
    clock.advance(CANCEL_SWEEP_INTERVAL_S)
    runner.check_room(1)
    assert asked == ["gone", "kept", "kept", "young"] and answers.count(young[0].ticket) == 1
    runner.start()
    runner.close(drain_timeout_s=10)
    answers.wait_for(4)
    assert all(answers.count(items[0].ticket) == 1 for items in (gone, kept, young))


def test_a_timeout_counts_from_the_given_arrival(clock, handler, answers):
    """submit(arrival_s=...) starts the timeout (and the queue delay) where the request reached the model."""
    runner = BatchRunner(make_queue(CPU, max_texts=64), handler, clock=clock, observer=Recorder())
    items = request(answers, [10])
    arrived = clock.now()
    clock.advance(0.3)  # decoding the request took 0.3 s
    runner.submit(items, timeout_s=1.0, arrival_s=arrived)
    assert items[0].arrival_s == arrived and items[0].deadline_s == pytest.approx(arrived + 1.0)
    runner.close(drain_timeout_s=0.0)
