"""Live swap vs Triton's own reload, side by side under load.

Starts a real tritonserver on a private model repository (v1 fp32, v2 int8 when built), runs 16
concurrent one-text streams (8 HTTP, 8 gRPC) and, in one run, ``--rounds`` times:
  1. steady state window;
  2. FastPath swap v1 -> v2 (fastpath_admin), then v2 -> v1;
  3. Triton's reload through the model-repository API (load with a config whose version_policy
     selects v2: Triton spawns a new stub, then unloads the old one), then back to v1 the same way.
For each switch it reports the time from the call to the last response of the old version, the
failed requests, and p99 latency in a window around the switch vs that round's steady state; for
FastPath swaps also the stub's own account (pickup of the command, and each stage of the swap).
The summary gives the median and range over rounds of each switch and of p99 / steady.

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
from tests.conftest import start_server  # noqa: E402
from tests.e2e.swap_support import MODELS, LoadStreams, admin, make_swap_repository  # noqa: E402

KEY = "bench-admin-key"
SWITCHES = ("fastpath_swap_v1_to_v2", "fastpath_swap_v2_to_v1", "triton_reload_v1_to_v2", "triton_reload_v2_to_v1")


def _switch_stats(records, call_s, returned_s, old, new, window_s, until_s):
    """Seconds from the call to the last old-version response done (before the next switch at
    ``until_s``), failures and p99 around the switch."""
    after = [r for r in records if call_s <= r[2] < until_s]
    old_done = [r[2] for r in after if r[4] and r[4][0] == old]
    last_old = max(old_done) if old_done else call_s
    window = [r[3] for r in records if call_s - 0.5 <= r[1] <= call_s + window_s]
    failed = [r for r in records if r[5] and call_s - 0.5 <= r[1] <= returned_s + window_s]
    return {
        "call_returned_s": round(returned_s - call_s, 3),
        "switch_s": round(last_old - call_s, 3),
        "new_version_seen": any(r[4] and r[4][0] == new for r in after),
        "failed_requests": len(failed),
        "failure_examples": sorted({r[5][:160] for r in failed})[:3],
        "p99_ms_during": round(float(np.percentile(window, 99)) * 1e3, 1) if window else None,
        "requests_during": len(window),
    }


def _triton_reload(server, version):
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("text_embedding")
    config["version_policy"] = {"specific": {"versions": [version]}}
    client.load_model("text_embedding", config=json.dumps(config), headers={"fastpath-admin-key": KEY})


def _fastpath_swap(server, version):
    reply = admin(server.http_url, {"command": "swap", "model": "text_embedding", "version": version, "key": KEY})
    return {name: {key: status.get(key) for key in ("pickup_s", "seconds", "last_swap_stages_s")}
            for name, status in reply["instances"].items()}


def _round(server, load, phase_s):
    """One steady window and the four switches; returns this round's results."""
    started = time.monotonic()
    time.sleep(phase_s)
    steady = [r[3] for r in load.snapshot() if started + 1.0 <= r[1] <= started + phase_s]
    actions = {"fastpath_swap_v1_to_v2": (lambda: _fastpath_swap(server, 2), 1, 2),
               "fastpath_swap_v2_to_v1": (lambda: _fastpath_swap(server, 1), 2, 1),
               "triton_reload_v1_to_v2": (lambda: _triton_reload(server, 2), 1, 2),
               "triton_reload_v2_to_v1": (lambda: _triton_reload(server, 1), 2, 1)}
    events = []
    for name in SWITCHES:
        action, old, new = actions[name]
        call = time.monotonic()
        stub = action()
        events.append((name, call, time.monotonic(), old, new, stub))
        time.sleep(phase_s)
    records = load.snapshot()
    results = {"steady": {"p99_ms": round(float(np.percentile(steady, 99)) * 1e3, 1), "requests": len(steady)}}
    ends = [event[1] for event in events[1:]] + [time.monotonic()]
    for (name, call, returned, old, new, stub), until in zip(events, ends):
        results[name] = _switch_stats(records, call, returned, old, new, window_s=max(2.0, returned - call + 1.0), until_s=until)
        results[name]["p99_over_steady"] = round(results[name]["p99_ms_during"] / results["steady"]["p99_ms"], 2)
        if stub:
            results[name]["stub"] = stub
    return results


def _summary(rounds):
    summary = {}
    for name in SWITCHES:
        switch = [r[name]["switch_s"] for r in rounds]
        ratio = [r[name]["p99_over_steady"] for r in rounds]
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
                  f"{r['p99_ms_during']:>9}{r['p99_over_steady']:>11.2f}")
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

    v2 = MODELS / "text_embedding" / "2"
    root = Path(tempfile.mkdtemp(prefix="hot-swap-bench-"))
    repository = make_swap_repository(root, {1: MODELS / "text_embedding" / "1", 2: v2})
    server = start_server(root, repository=repository, admin_key=KEY)
    load_average = Path("/proc/loadavg").read_text().split()[:3]
    try:
        with LoadStreams(server.http_url, server.grpc_url, pydoc_sentences(), count=args.streams) as load:
            rounds = [_round(server, load, args.duration_s / 5) for _ in range(args.rounds)]
    finally:
        server.stop()
    summary = _summary(rounds)
    report = {
        "command": "benchmarks/hot_swap.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, 2 cores (shared)",
        "load_average_at_start": load_average,
        "load_average_at_end": Path("/proc/loadavg").read_text().split()[:3],
        "streams": args.streams,
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
