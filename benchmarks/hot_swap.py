"""Live swap vs Triton's own reload, side by side under load.

Starts a real tritonserver on a private model repository (v1 fp32, v2 int8 when built), loads it with
16 concurrent one-text streams (8 HTTP, 8 gRPC) of real sentences and, in one run, ``--rounds`` times:
  1. steady state window;
  2. FastPath swap v1 -> v2 (fastpath_admin), then v2 -> v1;
  3. Triton's reload through the model-repository API (load with a config whose version_policy
     selects v2: Triton spawns a new stub, then unloads the old one), then back to v1 the same way.
For each switch it reports the time from the call to the last response of the old version, the
failed requests, and p99 latency in a window around the switch vs that round's steady state; for
FastPath swaps also the stub's own account (pickup of the command, and each stage of the swap).
The summary gives the median and range over rounds of each switch and of p99 / steady.

The load is perf_analyzer 2.51 (Triton's C++ load generator, ``make perf-analyzer``;
benchmarks/perf_analyzer.py): for each phase (the steady window, each switch) one run over gRPC and one
over HTTP, each with half the streams as synchronous workers, started ``LEAD_S`` before the switch and
ended (SIGINT) ``--duration-s / 5`` after the switch call returned. Their profile exports give every
request's send and response time and the ``MODEL_VERSION`` it was answered by, from which the switch time
and the latency windows are cut. Failed requests are what perf_analyzer reports: it stops a worker at
its first failed request and ends that run within half a second, so the count is the number of workers
that failed (a lower bound on the failed requests, exact when it is 0, the goal), the switch the phase
it happened in, and that run's requests are lost. The admin call and Triton's load call are single
control requests through tritonclient, not load.

    .venv/bin/python benchmarks/hot_swap.py --duration-s 30 --rounds 3 --out docs/benchmarks/hot_swap.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_analyzer as pa  # noqa: E402

from tests.conftest import start_server  # noqa: E402
from tests.e2e.swap_support import MODELS, admin, make_swap_repository  # noqa: E402

KEY = "bench-admin-key"
LEAD_S = 1.0  # load before each phase's switch call (and before the steady window)
SWITCHES = ("fastpath_swap_v1_to_v2", "fastpath_swap_v2_to_v1", "triton_reload_v1_to_v2", "triton_reload_v2_to_v1")


def _switch_stats(requests: list[pa.Request], errors: list[str], call_s: float, returned_s: float, old: int, new: int,
                  window_s: float) -> dict:
    """Seconds from the call to the last old-version response of the phase, its failed requests and p99 around
    the switch (requests sent from 0.5 s before the call to ``window_s`` after it)."""
    after = [r for r in requests if r.done_s >= call_s]
    old_done = [r.done_s for r in after if r.outputs.get("MODEL_VERSION") == old]
    last_old = max(old_done) if old_done else call_s
    window = [r.latency_s for r in requests if call_s - 0.5 <= r.sent_s <= call_s + window_s]
    return {
        "call_returned_s": round(returned_s - call_s, 3),
        "switch_s": round(last_old - call_s, 3),
        "new_version_seen": any(r.outputs.get("MODEL_VERSION") == new for r in after),
        "failed_requests": len(errors),
        "failure_examples": sorted({e[:160] for e in errors})[:3],
        "p99_ms_during": round(float(np.percentile(window, 99)) * 1e3, 1) if window else None,
        "requests_during": len(window),
    }


def _triton_reload(server, version):
    """Triton's own switch: load the model with a version policy of ``version``. FastPath's swap state (the
    serving-version record and the control plane's desired version) is removed first; otherwise the reloaded
    instance comes back on the version last swapped to (docs/design/hot-swap.md), and Triton's reload would
    not switch."""
    (Path(server.options.version_state_dir) / "text_embedding.json").unlink(missing_ok=True)
    (Path(server.state_dir) / "text_embedding" / "desired.json").unlink(missing_ok=True)
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("text_embedding")
    config["version_policy"] = {"specific": {"versions": [version]}}
    client.load_model("text_embedding", config=json.dumps(config), headers={"fastpath-admin-key": KEY})


def _fastpath_swap(server, version):
    reply = admin(server.http_url, {"command": "swap", "model": "text_embedding", "version": version, "key": KEY})
    return {name: {key: status.get(key) for key in ("pickup_s", "seconds", "last_swap_stages_s")}
            for name, status in reply["instances"].items()}


def _phase(analyzer: pa.PerfAnalyzer, loads: list[pa.Load], root: Path, phase_s: float, action=None) -> dict:
    """One phase under load: start the runs, ``LEAD_S`` later call ``action`` (if any), ``phase_s`` after it
    returned end the runs. Returns the requests of both runs, their failures and the call's times."""
    runs = [pa.TimedRun(analyzer, load, root / f"export_{load.protocol}.json") for load in loads]
    try:
        for run in runs:
            run.start()
        time.sleep(LEAD_S)
        call_s = time.time()
        stub = action() if action else None
        returned_s = time.time()
        time.sleep(phase_s)
        requests, errors = [], []
        for run in runs:
            try:
                result = run.stop()
            except pa.PerfAnalyzerError as exc:  # it stopped at a failed request: its requests are lost
                errors += exc.errors or [str(exc)]
                continue
            requests += result.requests
            errors += result.errors
    finally:
        for run in runs:
            run.__exit__(None, None, None)
    return {"requests": requests, "errors": errors, "call_s": call_s, "returned_s": returned_s, "stub": stub}


def _round(server, analyzer: pa.PerfAnalyzer, loads: list[pa.Load], root: Path, phase_s: float) -> dict:
    """One steady window and the four switches, each a phase of its own load; returns this round's results."""
    steady = _phase(analyzer, loads, root, phase_s)
    latencies = [r.latency_s for r in steady["requests"] if steady["call_s"] <= r.sent_s <= steady["returned_s"] + phase_s]
    results = {"steady": {"p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 1), "requests": len(latencies),
                          "failed_requests": len(steady["errors"])}}
    actions = {"fastpath_swap_v1_to_v2": (lambda: _fastpath_swap(server, 2), 1, 2),
               "fastpath_swap_v2_to_v1": (lambda: _fastpath_swap(server, 1), 2, 1),
               "triton_reload_v1_to_v2": (lambda: _triton_reload(server, 2), 1, 2),
               "triton_reload_v2_to_v1": (lambda: _triton_reload(server, 1), 2, 1)}
    for name in SWITCHES:
        action, old, new = actions[name]
        phase = _phase(analyzer, loads, root, phase_s, action)
        call, returned = phase["call_s"], phase["returned_s"]
        results[name] = _switch_stats(phase["requests"], phase["errors"], call, returned, old, new,
                                      window_s=max(2.0, returned - call + 1.0))
        during = results[name]["p99_ms_during"]
        results[name]["p99_over_steady"] = round(during / results["steady"]["p99_ms"], 2) if during is not None else None
        if phase["stub"]:
            results[name]["stub"] = phase["stub"]
    return results


def _summary(rounds):
    summary = {}
    for name in SWITCHES:
        switch = [r[name]["switch_s"] for r in rounds]
        ratio = [r[name]["p99_over_steady"] for r in rounds if r[name]["p99_over_steady"] is not None] or [float("nan")]
        summary[name] = {"switch_s_median": round(statistics.median(switch), 3), "switch_s_range": [min(switch), max(switch)],
                         "p99_over_steady_median": round(statistics.median(ratio), 2), "p99_over_steady_range": [min(ratio), max(ratio)],
                         "failed_requests": sum(r[name]["failed_requests"] for r in rounds)}
    return summary


def _print(rounds, summary):
    print(f"{'round':<6}{'switch':<26}{'call s':>8}{'switch s':>10}{'failed':>8}{'p99 ms':>9}{'p99/steady':>11}")
    for index, results in enumerate(rounds, 1):
        for name in SWITCHES:
            r = results[name]
            print(f"{index:<6}{name:<26}{r['call_returned_s']:>8.3f}{r['switch_s']:>10.3f}{r['failed_requests']:>8}"
                  f"{r['p99_ms_during']!s:>9}{r['p99_over_steady']!s:>11}")
        print(f"{index:<6}steady p99 {results['steady']['p99_ms']} ms over {results['steady']['requests']} requests")
    for name, s in summary.items():
        print(f"median {name:<26} switch {s['switch_s_median']:.3f} s {s['switch_s_range']}, "
              f"p99/steady {s['p99_over_steady_median']} {s['p99_over_steady_range']}, failed {s['failed_requests']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=30.0, help="load duration of one round (5 phases)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds in one run, on one server")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/hot_swap.json"))
    args = parser.parse_args()
    from fastpath.text.corpus import pydoc_sentences

    analyzer = pa.find()
    v2 = MODELS / "text_embedding" / "2"
    root = Path(tempfile.mkdtemp(prefix="hot-swap-bench-"))
    repository = make_swap_repository(root, {1: MODELS / "text_embedding" / "1", 2: v2})
    data = pa.write_input_data(root / "texts.json", pa.text_entries(pydoc_sentences()))
    server = start_server(root, repository=repository, admin_key=KEY)
    loads = [pa.Load(model="text_embedding", url=server.grpc_url, protocol="grpc", data=data, concurrency=(args.streams + 1) // 2),
             pa.Load(model="text_embedding", url=server.http_url, protocol="http", data=data, concurrency=max(1, args.streams // 2))]
    load_average = Path("/proc/loadavg").read_text().split()[:3]
    try:
        rounds = [_round(server, analyzer, loads, root, args.duration_s / 5) for _ in range(args.rounds)]
    finally:
        server.stop()
    summary = _summary(rounds)
    report = {
        "command": "benchmarks/hot_swap.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, 2 cores (shared)",
        "load_average_at_start": load_average,
        "load_average_at_end": Path("/proc/loadavg").read_text().split()[:3],
        "streams": args.streams,
        "load": f"perf_analyzer 2.51: {loads[0].concurrency} gRPC + {loads[1].concurrency} HTTP synchronous workers, one run each per phase",
        "v2_precision": json.loads((v2 / "manifest.json").read_text()).get("precision"),
        "summary": summary,
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _print(rounds, summary)
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
