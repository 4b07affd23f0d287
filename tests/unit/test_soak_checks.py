"""The soak's verdicts (benchmarks/gpu/soak_checks.py) and its schedule (benchmarks/gpu/soak.py), on recorded values:
version consistency around swaps and reloads, failures inside and outside the killed stub's window, request
counts across Triton's statistics resets, memory drift after warm-up per process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

from soak import plan  # noqa: E402
from soak_actions import reload_config  # noqa: E402
from soak_checks import (  # noqa: E402
    Action,
    MonotoneCounter,
    Response,
    Segment,
    failures_by_window,
    load_summary,
    memory_drift,
    memory_verdict,
    serving_version,
    version_consistency,
)
from soak_parts import process_of  # noqa: E402

# a soak's first 80 s: a swap 1 -> 2, a reload that keeps 2 (new stubs), a swap 2 -> 1, a reload whose status read failed
ACTIONS = [Action(kind="swap", call_s=10.0, return_s=10.8, version_before=1, version_after=2),
           Action(kind="reload", call_s=40.0, return_s=46.3, version_before=2, version_after=2),
           Action(kind="swap", call_s=50.0, return_s=51.2, version_before=2, version_after=1),
           Action(kind="reload", call_s=70.0, return_s=75.0, version_before=1, version_after=None)]


def test_serving_version_follows_status_after_each_action_returned():
    """Invariant: the serving version at t is what status reported after the last action returned by t; before any,
    the initial one; an action whose status read failed (None) changes nothing."""
    assert [serving_version(ACTIONS, 1, t) for t in (0.0, 10.5, 10.8, 45.0, 52.0, 80.0)] == [1, 1, 2, 2, 1, 1]


def test_responses_inside_a_swap_may_carry_either_version_and_all_others_the_serving_one():
    """Invariant: a response overlapping a swap's [call, return] carries the version before or after it (counted old or
    new); any other carries the serving version at its send and receive time, during a reload too; failed ones
    (no version) are not checked."""
    responses = [Response(sent_s=1.0, done_s=1.05, version=1),
                 Response(sent_s=10.5, done_s=10.6, version=1),   # inside the swap: the old version
                 Response(sent_s=10.7, done_s=10.9, version=2),   # overlaps its return: the new one
                 Response(sent_s=20.0, done_s=20.04, version=2),
                 Response(sent_s=20.2, done_s=20.25, version=1),  # 10 s after the swap returned: wrong
                 Response(sent_s=42.0, done_s=42.1, version=2),   # during the reload: the version kept
                 Response(sent_s=43.0, done_s=43.1, version=1),   # a reload has no allowance: wrong
                 Response(sent_s=50.9, done_s=51.5, version=1),   # overlaps the second swap's return: its new version
                 Response(sent_s=60.0, done_s=75.0, version=None, error="[StatusCode.DEADLINE_EXCEEDED] Deadline Exceeded"),
                 Response(sent_s=80.0, done_s=80.1, version=1)]   # after a reload whose status read failed: still 1
    found = version_consistency(responses, ACTIONS, initial_version=1)
    assert (found["answered"], found["consistent"], found["inconsistent"]) == (9, 7, 2)
    assert found["in_swap_windows"] == {"old": 1, "new": 2}
    assert found["examples"] == [{"sent_s": 20.2, "done_s": 20.25, "version": 1, "expected": [2]},
                                 {"sent_s": 43.0, "done_s": 43.1, "version": 1, "expected": [2]}]


def test_failed_probe_requests_split_at_the_killed_stubs_window():
    """Invariant: a failed request whose [sent, done] overlaps the kill window counts inside, any other outside (with
    its time and message); answered requests count in neither."""
    kill = [(85.0, 94.5)]
    responses = [Response(sent_s=84.9, done_s=99.9, version=None, error="[StatusCode.DEADLINE_EXCEEDED] Deadline Exceeded"),
                 Response(sent_s=90.1, done_s=90.2, version=None, error="Request for unknown model: 'text_embedding' has no available versions"),
                 Response(sent_s=91.0, done_s=91.1, version=1),
                 Response(sent_s=120.0, done_s=120.1, version=None, error="Stub process 'text_embedding_0_0' is not healthy.")]
    assert failures_by_window(responses, kill) == {
        "inside": 2, "outside": 1, "outside_examples": [{"sent_s": 120.0, "error": "Stub process 'text_embedding_0_0' is not healthy."}]}


def test_request_counts_survive_the_resets_of_a_reload():
    """Invariant: the total is the sum of increases, and a reading below the previous one (Triton's statistics start
    again at 0 after a reload) counts in full as a reset."""
    counter = MonotoneCounter()
    assert [counter.update(reading) for reading in (100, 150, 30, 80, 80, 5)] == [0, 50, 80, 130, 130, 135]
    assert counter.resets == 2


@given(st.lists(st.lists(st.integers(0, 10_000), min_size=1, max_size=8), min_size=1, max_size=6))
def test_request_counts_over_model_lifetimes(lifetimes):
    """Invariant: over lifetimes of the model, each read in nondecreasing order and each (after the first) starting
    below where the previous one ended, the total is the sum of each lifetime's last reading less the first reading."""
    readings = []
    for increments in lifetimes:
        values = [sum(increments[: i + 1]) for i in range(len(increments))]
        if readings and values[0] >= readings[-1][-1]:
            continue  # a reset that is not seen: out of the counter's contract
        readings.append(values)
    counter = MonotoneCounter()
    for values in readings:
        for value in values:
            counter.update(value)
    assert counter.total == sum(values[-1] for values in readings) - readings[0][0]
    assert counter.resets == len(readings) - 1


def test_memory_drift_per_process_after_its_own_warm_up():
    """Invariant: each series' baseline is its first sample at least warmup_s after its process was first seen (a stub's
    series per serving version share the process's start); drift is the last sample against it, max drift the largest
    change after it; fewer than two samples after warm-up leaves it unjudged."""
    samples = [(0.0, {"tritonserver pid 10": 50.0, "stub text_embedding_0_0 pid 20 @ v1": 350.0}),
               (30.0, {"tritonserver pid 10": 51.0, "stub text_embedding_0_0 pid 20 @ v2": 320.0}),
               (60.0, {"tritonserver pid 10": 52.0, "stub text_embedding_0_0 pid 20 @ v1": 366.0}),
               (90.0, {"tritonserver pid 10": 52.5, "stub text_embedding_0_0 pid 20 @ v2": 322.0,
                       "stub text_embedding_0_0 pid 30 @ v2": 300.0}),
               (120.0, {"tritonserver pid 10": 53.0, "stub text_embedding_0_0 pid 20 @ v1": 385.0,
                        "stub text_embedding_0_0 pid 30 @ v1": 310.0})]
    drift = memory_drift(samples, warmup_s=60.0, process_of=process_of)
    assert drift["tritonserver pid 10"] == {"first_seen_s": 0.0, "samples": 5, "last_s": 120.0, "last": 53.0, "baseline_s": 60.0,
                                            "baseline": 52.0, "drift_pct": 1.92, "max_drift_pct": 1.92, "within": True}
    stub_v1 = drift["stub text_embedding_0_0 pid 20 @ v1"]
    assert (stub_v1["baseline"], stub_v1["drift_pct"], stub_v1["within"]) == (366.0, 5.19, False)
    assert drift["stub text_embedding_0_0 pid 20 @ v2"]["within"] is None  # only the 90 s sample is past its warm-up
    assert drift["stub text_embedding_0_0 pid 30 @ v1"]["first_seen_s"] == 90.0  # a new process: its own warm-up
    assert drift["stub text_embedding_0_0 pid 30 @ v1"]["why"] == "0 sample(s) at least 60 s after it was first seen"
    assert memory_verdict(drift) is False
    assert memory_verdict({k: v for k, v in drift.items() if k != "stub text_embedding_0_0 pid 20 @ v1"}) is True
    assert memory_verdict(memory_drift(samples[:2], warmup_s=60.0)) is None


def test_a_process_that_exits_is_not_judged_on_its_last_sample():
    """Invariant: the last sample of a process gone before the soak's last sample (a stub of the generation a reload
    replaced, sampled while it frees its memory) is left out of its drift; a process alive at the end keeps every sample."""
    samples = [(0.0, {"stub text_embedding_0_2 pid 18 @ v1": 1028.0}),
               (60.0, {"stub text_embedding_0_2 pid 18 @ v1": 1240.0}),
               (90.0, {"stub text_embedding_0_2 pid 18 @ v1": 1240.0}),
               (120.0, {"stub text_embedding_0_2 pid 18 @ v1": 1060.0, "stub text_embedding_0_2 pid 22 @ v1": 1028.0}),
               (150.0, {"stub text_embedding_0_2 pid 22 @ v1": 1028.0})]
    drift = memory_drift(samples, warmup_s=60.0, process_of=process_of)
    old = drift["stub text_embedding_0_2 pid 18 @ v1"]
    assert (old["ended_s"], old["baseline"], old["max_drift_pct"], old["within"]) == (120.0, 1240.0, 0.0, True)
    assert "ended_s" not in drift["stub text_embedding_0_2 pid 22 @ v1"]


def test_load_failures_split_into_kill_segments_and_the_rest():
    """Invariant: a perf_analyzer run overlapping the kill window counts with the kill segments, with its failed
    requests and run errors; the others' totals are the goal's."""
    segments = [Segment(index=4, start_s=60.4, end_s=75.5, succeeded=3554, failed=0),
                Segment(index=5, start_s=75.5, end_s=105.1, succeeded=2505, failed=2, client_errors=("Stub process 'text_embedding_0_0' is not healthy.",),
                        run_error="did not end within 15 s of SIGINT: requests it sent were never answered"),
                Segment(index=7, start_s=106.1, end_s=120.6, succeeded=1985, failed=0)]
    summary = load_summary(segments, [(85.0, 94.5)])
    assert summary["periods"] == 3
    assert {k: summary["outside_kill"][k] for k in ("runs", "succeeded", "failed_triton", "failed_perf_analyzer", "run_error_count")} \
        == {"runs": 2, "succeeded": 5539, "failed_triton": 0, "failed_perf_analyzer": 0, "run_error_count": 0}
    kill = summary["kill_segments"]
    assert (kill["runs"], kill["failed_triton"], kill["failed_perf_analyzer"], kill["run_error_count"]) == (1, 2, 1, 1)
    assert kill["run_errors"] == ["segment 5 at 75.5 s: did not end within 15 s of SIGINT: requests it sent were never answered"]


@pytest.mark.parametrize(("kwargs", "message"), [({"kind": "restart"}, "not one of"), ({"return_s": 9.0}, "before its call")])
def test_an_action_refuses_an_unknown_kind_or_a_return_before_its_call(kwargs, message):
    """Invariant: an action's kind is swap, reload or kill, and it returns no earlier than it was called."""
    with pytest.raises(ValueError, match=message):
        Action(**{"kind": "swap", "call_s": 10.0, "return_s": 10.8, "version_before": 1, "version_after": 2, **kwargs})


def test_the_schedule_swaps_every_period_and_spaces_the_reloads_and_the_kill():
    """Invariant: one swap a third into each period; reloads at 1/4 and 3/4 of the run and the kill at 1/2, two thirds
    into their periods, so no two actions are due together."""
    actions = plan(600.0, 30.0)
    assert [t for t, kind in actions if kind == "swap"] == [10.0 + 30 * k for k in range(20)]
    assert [(t, kind) for t, kind in actions if kind != "swap"] == [(170.0, "reload"), (320.0, "kill"), (470.0, "reload")]
    assert [(t, kind) for t, kind in plan(150.0, 15.0) if kind != "swap"] == [(40.0, "reload"), (85.0, "kill"), (130.0, "reload")]


def test_a_reload_override_changes_only_when_requests_are_asked_whether_they_were_cancelled():
    """Invariant: the override is the loaded config with cancel_check_after_us one microsecond more (FastPath's default
    250000 when the config does not set it); every other field is the loaded config's."""
    loaded = {"name": "text_embedding", "max_batch_size": 64, "parameters": {"runtime": {"string_value": "torch"}}}
    once = reload_config(loaded)
    assert once == {"name": "text_embedding", "max_batch_size": 64, "parameters": {
        "runtime": {"string_value": "torch"}, "cancel_check_after_us": {"string_value": "250001"}}}
    assert reload_config(once)["parameters"]["cancel_check_after_us"] == {"string_value": "250002"}
