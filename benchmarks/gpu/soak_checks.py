"""The soak's verdicts (benchmarks/gpu/soak.py), pure functions of what it recorded: each probe response's
``MODEL_VERSION`` against the serving version, failed requests inside and outside the killed stub's window,
request counts across resets of Triton's statistics, and each process's memory drift after its warm-up.

Every time is seconds on one monotonic clock (the soak's: seconds since the server was ready).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

ACTION_KINDS = ("swap", "reload", "kill")
MEMORY_TOLERANCE_PCT = 5.0  # the spec's goal: RSS and GPU memory flat within 5 % after warm-up


@dataclasses.dataclass(frozen=True, kw_only=True)
class Response:
    """One probe request: sent and answered (seconds), the ``MODEL_VERSION`` it carried, or its error."""

    sent_s: float
    done_s: float
    version: int | None
    error: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Action:
    """One action on the served model: ``kind`` (:data:`ACTION_KINDS`), when it was called and when it returned
    (a kill returns once the model serves again), and the serving version ``status`` reported before and after."""

    kind: str
    call_s: float
    return_s: float
    version_before: int | None
    version_after: int | None
    ok: bool = True
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"action kind {self.kind!r} is not one of {ACTION_KINDS}")
        if self.return_s < self.call_s:
            raise ValueError(f"action {self.kind} returned at {self.return_s} s, before its call at {self.call_s} s")


def overlaps(start_s: float, end_s: float, window: tuple[float, float]) -> bool:
    """Whether ``[start_s, end_s]`` and the closed interval ``window`` share a moment."""
    return start_s <= window[1] and window[0] <= end_s


def serving_version(actions: Iterable[Action], initial_version: int, at_s: float) -> int:
    """The version ``status`` last reported at ``at_s``: that after the latest action returned by then (one whose
    status read failed, ``version_after`` None, changes nothing), else ``initial_version``."""
    version = initial_version
    for action in sorted(actions, key=lambda a: a.return_s):
        if action.return_s <= at_s and action.version_after is not None:
            version = action.version_after
    return version


def version_consistency(responses: Iterable[Response], actions: list[Action], initial_version: int,
                        examples: int = 5) -> dict:
    """Check every answered probe response's version against the serving version.

    A response whose ``[sent_s, done_s]`` overlaps a swap's ``[call_s, return_s]`` may carry the version before
    or after that swap; any other must carry :func:`serving_version` at its send and receive time (reloads and
    the killed stub's recovery have no such allowance: they must keep the version).

    Returns:
        ``answered``, ``consistent``, ``inconsistent`` (counts), ``in_swap_windows`` (those of the allowance,
        ``old``/``new``: before or after the swap) and up to ``examples`` inconsistent responses.
    """
    swaps = [a for a in actions if a.kind == "swap"]
    found = {"answered": 0, "consistent": 0, "inconsistent": 0, "in_swap_windows": {"old": 0, "new": 0}, "examples": []}
    for response in responses:
        if response.version is None:
            continue
        found["answered"] += 1
        during = [s for s in swaps if overlaps(response.sent_s, response.done_s, (s.call_s, s.return_s))]
        if during:
            allowed = {s.version_before for s in during} | {s.version_after for s in during}
        else:
            allowed = {serving_version(actions, initial_version, response.sent_s),
                       serving_version(actions, initial_version, response.done_s)}
        if response.version not in allowed:
            found["inconsistent"] += 1
            if len(found["examples"]) < examples:
                found["examples"].append({"sent_s": round(response.sent_s, 3), "done_s": round(response.done_s, 3),
                                          "version": response.version, "expected": sorted(v for v in allowed if v is not None)})
            continue
        found["consistent"] += 1
        if during:
            found["in_swap_windows"]["new" if response.version == during[-1].version_after else "old"] += 1
    return found


def failures_by_window(responses: Iterable[Response], windows: list[tuple[float, float]], examples: int = 5) -> dict:
    """Failed probe requests: ``inside`` (``[sent_s, done_s]`` overlaps one of ``windows``, the killed stub's),
    ``outside`` and up to ``examples`` of the outside ones (time and error)."""
    found: dict = {"inside": 0, "outside": 0, "outside_examples": []}
    for response in responses:
        if response.error is None:
            continue
        if any(overlaps(response.sent_s, response.done_s, window) for window in windows):
            found["inside"] += 1
            continue
        found["outside"] += 1
        if len(found["outside_examples"]) < examples:
            found["outside_examples"].append({"sent_s": round(response.sent_s, 3), "error": response.error[:200]})
    return found


class MonotoneCounter:
    """A cumulative count kept across resets of its source: Triton's statistics of a model start again from 0
    when it is loaded again (a reload, the stub supervisor's reload), so a reading below the previous one is a
    reset and counts in full. Requests counted by the old model after the last reading before a reset are missed
    (at most one polling interval's); a reset whose first reading already exceeds the previous one is not seen."""

    def __init__(self) -> None:
        self.total = 0
        self.resets = 0
        self._last: int | None = None

    def update(self, reading: int) -> int:
        """Take one reading of the source; returns the total counted since the first reading."""
        if self._last is not None:
            if reading >= self._last:
                self.total += reading - self._last
            else:
                self.total += reading
                self.resets += 1
        self._last = reading
        return self.total


def memory_drift(samples: Iterable[tuple[float, dict[str, float]]], *, warmup_s: float,
                 tolerance_pct: float = MEMORY_TOLERANCE_PCT, process_of: Callable[[str], str] = str) -> dict[str, dict]:
    """Per series (key), its value after warm-up against the rest.

    Args:
        samples: ``(t_s, {series: value})`` in time order.
        warmup_s: a series' baseline is its first sample at least this long after its process was first seen.
        tolerance_pct: the goal for ``max_drift_pct``.
        process_of: the process a series belongs to (one pid: a restarted stub is a new process), e.g. a stub's
            series per serving version; by default each series is a process of its own.

    A process that exits before the last sample is not judged on its own last sample: that one may catch it
    being torn down (a stub of the generation a reload replaced, freeing its memory while its successor serves).

    Returns:
        Per process: ``first_seen_s``, ``baseline_s``/``baseline``, ``last_s``/``last``, ``drift_pct`` (last
        against baseline, signed), ``max_drift_pct`` (largest absolute change of any later sample) and ``within``
        (True/False; None with ``why`` when fewer than two samples came after its warm-up); ``ended_s`` for a
        process that exited (its last sample, left out).
    """
    series: dict[str, list[tuple[float, float]]] = {}
    born: dict[str, float] = {}
    seen: dict[str, float] = {}
    final_s = None
    for t_s, values in samples:
        final_s = t_s
        for key, value in values.items():
            series.setdefault(key, []).append((t_s, float(value)))
            born.setdefault(process_of(key), t_s)
            seen[process_of(key)] = t_s
    found = {}
    for key, points in series.items():
        first_seen_s, ended_s = born[process_of(key)], seen[process_of(key)]
        ended = ended_s < final_s
        after = [(t, v) for t, v in points if t >= first_seen_s + warmup_s and not (ended and t == ended_s)]
        entry: dict = {"first_seen_s": round(first_seen_s, 1), "samples": len(points), "last_s": round(points[-1][0], 1),
                       "last": points[-1][1], **({"ended_s": round(ended_s, 1)} if ended else {})}
        if len(after) < 2 or after[0][1] <= 0:
            found[key] = {**entry, "within": None, "why": f"{len(after)} sample(s) at least {warmup_s:g} s after it was first seen"}
            continue
        base = after[0][1]
        max_drift = max(abs(v - base) / base * 100 for _, v in after)
        found[key] = {**entry, "baseline_s": round(after[0][0], 1), "baseline": base,
                      "drift_pct": round((after[-1][1] - base) / base * 100, 2), "max_drift_pct": round(max_drift, 2),
                      "within": max_drift <= tolerance_pct}
    return found


def memory_verdict(drifts: dict[str, dict]) -> bool | None:
    """True when every process judged stayed within the tolerance, False when one did not, None when none was judged."""
    judged = [entry["within"] for entry in drifts.values() if entry["within"] is not None]
    return all(judged) if judged else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Segment:
    """One perf_analyzer run of the load: its action period, when it ran, the requests Triton's statistics counted
    meanwhile (``succeeded``, ``failed``: the probe's included), the failed requests perf_analyzer reported
    (``client_errors``, one per worker: it stops a worker at its first) and ``run_error`` when it failed without
    any (it did not start, or exited on its own)."""

    index: int
    start_s: float
    end_s: float
    succeeded: int
    failed: int
    client_errors: tuple[str, ...] = ()
    run_error: str | None = None


def load_summary(segments: list[Segment], kill_windows: list[tuple[float, float]], examples: int = 3) -> dict:
    """Requests and failures of the load, split into the segments that overlap a killed stub's window (the kill
    segments, whose failures the goal allows) and the others."""
    def totals(chosen: list[Segment]) -> dict:
        errors = [e for s in chosen for e in s.client_errors]
        run_errors = [f"segment {s.index} at {s.start_s:.1f} s: {s.run_error}" for s in chosen if s.run_error]
        return {"runs": len(chosen), "succeeded": sum(s.succeeded for s in chosen), "failed_triton": sum(s.failed for s in chosen),
                "failed_perf_analyzer": len(errors), "error_examples": sorted(set(e[:200] for e in errors))[:examples],
                "run_errors": run_errors[:examples], "run_error_count": len(run_errors)}

    inside = [s for s in segments if any(overlaps(s.start_s, s.end_s, w) for w in kill_windows)]
    outside = [s for s in segments if s not in inside]
    return {"periods": len({s.index for s in segments}), "outside_kill": totals(outside), "kill_segments": totals(inside)}
