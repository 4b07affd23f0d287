"""CPU benchmark of text_detection: FastPath's scheduler + staging pool vs a synchronous baseline.

Run from the repository root with the artifacts built (about 6 minutes on a 2-core machine):

    .venv/bin/python benchmarks/text_detection_cpu.py

Both variants run side by side in this one run, each in its own tritonserver (both up throughout; see
:func:`run` for why not one server), same artifact, same ONNX Runtime settings:

    fastpath   model_repository/text_detection: execute() decodes/resizes and queues; ExactShapePolicy
               batches images of one resized shape across requests; one staging-pool block per batch
    sync       benchmarks/models/sync_detection: an execute() without the scheduler, blocking, one request
               per engine call (Triton hands a max_batch_size-0 model one request at a time)

Workloads (real photos from scikit-image's wheel, sent as UINT8 ``IMAGE`` over gRPC by perf_analyzer, closed
loop, measured by perf_analyzer itself: windows of ``--window-ms`` until three agree within STABILITY_PCT;
:func:`load`, benchmarks/perf_analyzer.py):

    same       one image per request, eight 512x512 photos (all resize to 512x512)
    mixed      one image per request, ten photos of eight resized shapes (192x384 .. 416x640)
    batch4     four of the mixed photos per request, padded with white to 512x640 (one IMAGE tensor
               needs one size), so all resize to 512x640: the sync path batches within a request too

Each (workload, concurrency) cell runs ``--rounds`` rounds; in each round both variants run back to
back, in alternating order, and the ratio fastpath / sync is taken within the round (the machine is
shared; load drifts between rounds). Reported: median ratio over rounds, throughput (images/s)
median over rounds, perf_analyzer's client p50 / p99 per request (median over rounds), and FastPath's mean images per
engine call (from its ``fastpath_batch_size`` histogram). Before measuring, every photo is sent
to both variants once and their boxes must be equal.
Writes docs/benchmarks/text_detection_cpu.json and .md (``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import perf_analyzer as pa  # noqa: E402

SOURCE = REPO / "model_repository" / "text_detection"
VARIANTS = {"fastpath": "text_detection", "sync": "sync_detection"}
SAME = ["astronaut.png", "brick.png", "camera.png", "grass.png", "gravel.png", "ihc.png", "moon.png", "logo.png"]
MIXED = ["page.png", "text.png", "coffee.png", "rocket.jpg", "chelsea.png", "coins.png", "clock_motion.png", "horse.png",
         "astronaut.png", "camera.png"]
WORKLOADS = {"same": (SAME, 1), "mixed": (MIXED, 1), "batch4": (MIXED, 4)}
# perf_analyzer's windows agree within this (and twice this with windows twice as long on its retry): at 5-15
# images/s a window holds a few dozen requests, and this 2-core machine's speed drifts by up to 1.5x over minutes
# for both variants alike (the ratio is taken within a round); at 25 % a cell failed to stabilize in 6 windows.
STABILITY_PCT = 50


def build_repository(root: Path) -> Path:
    """text_detection and the sync_detection baseline, artifacts linked in from model_repository."""
    repository = root / "repository"
    for name, config, model_py in (("text_detection", SOURCE / "config.pbtxt", SOURCE / "1" / "model.py"),
                                   ("sync_detection", REPO / "benchmarks" / "models" / "sync_detection" / "config.pbtxt",
                                    REPO / "benchmarks" / "models" / "sync_detection" / "1" / "model.py")):
        version = repository / name / "1"
        version.mkdir(parents=True)
        shutil.copy(config, repository / name / "config.pbtxt")
        (version / "model.py").symlink_to(model_py)
        for artifact in ("model.onnx", "manifest.json"):
            (version / artifact).symlink_to(SOURCE / "1" / artifact)
    return repository


def batch_stats(metrics_url: str) -> tuple[float, float]:
    """(engine calls, images) of text_detection so far, from fastpath_batch_size's count and sum."""
    import urllib.request

    time.sleep(0.6)  # FastPath publishes its metrics every metrics_interval_ms (500 ms)
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    values = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        for key in values:
            if line.startswith(f"fastpath_batch_size_{key}{{") and 'model="text_detection"' in line:
                values[key] += float(line.rsplit(" ", 1)[1])
    return values["count"], values["sum"]


def load(url: str, model: str, requests: list[np.ndarray], concurrency: int, window_ms: int, csv_path: Path) -> dict:
    """Closed loop from perf_analyzer over gRPC: ``concurrency`` requests in flight cycling through ``requests``
    (UINT8 [N, H, W, 3] each, N alike), measured by perf_analyzer itself (:func:`perf_analyzer.stable_cell`:
    windows of ``window_ms`` until three agree within :data:`STABILITY_PCT`; its CSV).

    Not from a profile export: perf_analyzer 2.51 writes every request's input tensors into it (uint8 photos as
    JSON numbers, tens of MB per second of load), which is neither needed here nor reliably readable.

    Returns {"images_per_s": its requests/s x N, "p50_ms", "p99_ms": client latency per request, "errors": failed
    requests}. perf_analyzer stops a worker at its first failed request and the run at the window's end: then
    ``errors`` counts the workers that failed (a lower bound) and the cell's figures are lost (0 images/s, none).
    """
    data = pa.write_input_data(csv_path.with_suffix(".json"), pa.array_entries(requests, "IMAGE"))
    try:
        cell = pa.stable_cell(pa.find(), pa.Load(model=model, url=url, data=data, concurrency=concurrency),
                              measurement_ms=window_ms, csv_path=csv_path, stability_pct=STABILITY_PCT)
    except pa.PerfAnalyzerError as exc:
        if not exc.errors:
            raise
        return {"images_per_s": 0.0, "p50_ms": None, "p99_ms": None, "errors": len(exc.errors)}
    return {"images_per_s": cell["req_per_s"] * requests[0].shape[0], "p50_ms": cell["p50_us"] / 1e3,
            "p99_ms": cell["p99_us"] / 1e3, "errors": 0, "unstable_first_try": cell["unstable_first_try"]}


def workload_requests(name: str) -> list[np.ndarray]:
    from unit.models.text_detection.reference import skimage_rgb

    files, per_request = WORKLOADS[name]
    photos = [skimage_rgb(file) for file in files]
    if per_request == 1:
        return [photo[None] for photo in photos]
    # several images in one IMAGE tensor must share a size: pad each photo with white to the largest
    height, width = max(p.shape[0] for p in photos), max(p.shape[1] for p in photos)
    padded = [np.pad(p, ((0, height - p.shape[0]), (0, width - p.shape[1]), (0, 0)), constant_values=255) for p in photos]
    return [np.stack([padded[(k + j) % len(padded)] for j in range(per_request)]) for k in range(len(padded))]


def check_equal(servers: dict, requests: list[np.ndarray]) -> int:
    """Send every request to both variants; their boxes must be equal. Returns the boxes compared."""
    import tritonclient.grpc as grpcclient

    clients, compared = {v: grpcclient.InferenceServerClient(s.grpc_url) for v, s in servers.items()}, 0
    for batch in requests:
        tensor = grpcclient.InferInput("IMAGE", list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch)
        fast, sync = (clients[v].infer(model, [tensor], client_timeout=120) for v, model in VARIANTS.items())
        for output in ("BOXES", "SCORES", "BOX_COUNTS"):
            np.testing.assert_array_equal(fast.as_numpy(output), sync.as_numpy(output))
        compared += fast.as_numpy("BOXES").shape[0]
    return compared


def median_of(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def summarize(cells: dict) -> list[dict]:
    rows = []
    for key, rounds in cells.items():
        workload, concurrency = key.split("@")
        row = {"workload": workload, "concurrency": int(concurrency), "rounds": len(rounds),
               "ratio_per_round": [round(r["fastpath"]["images_per_s"] / r["sync"]["images_per_s"], 3)
                                   if r["sync"]["images_per_s"] else float("inf") for r in rounds],
               "images_per_engine_call": statistics.median(r["fastpath"]["images_per_call"] for r in rounds)}
        row["ratio_throughput"] = statistics.median(row["ratio_per_round"])
        for variant in VARIANTS:
            row[variant] = {"images_per_s": statistics.median(r[variant]["images_per_s"] for r in rounds),
                            "p50_ms": median_of([r[variant]["p50_ms"] for r in rounds]),
                            "p99_ms": median_of([r[variant]["p99_ms"] for r in rounds]),
                            "errors": sum(r[variant]["errors"] for r in rounds)}
        fast, sync = row["fastpath"], row["sync"]
        row["ratio_p50"] = fast["p50_ms"] / sync["p50_ms"] if fast["p50_ms"] and sync["p50_ms"] else None
        row["ratio_p99"] = fast["p99_ms"] / sync["p99_ms"] if fast["p99_ms"] and sync["p99_ms"] else None
        rows.append(row)
    return rows


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = ["| workload | c | sync img/s | fastpath img/s | **ratio** (rounds) | sync p50 / p99 ms | fastpath p50 / p99 ms "
             "| p50 ratio | p99 ratio | img per call |", "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        s, f = r["sync"], r["fastpath"]
        lines.append(f"| {r['workload']} | {r['concurrency']} | {s['images_per_s']:.2f} | {f['images_per_s']:.2f} | "
                     f"**{r['ratio_throughput']:.2f}** ({', '.join(f'{x:.2f}' for x in r['ratio_per_round'])}) | "
                     f"{_f(s['p50_ms'])} / {_f(s['p99_ms'])} | {_f(f['p50_ms'])} / {_f(f['p99_ms'])} | "
                     f"{_f(r['ratio_p50'], 2)} | {_f(r['ratio_p99'], 2)} | {r['images_per_engine_call']:.2f} |")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    machine = report["machine"]
    return "\n".join([
        "# text_detection on CPU: FastPath scheduler + staging pool vs a synchronous baseline",
        "",
        f"Command (repository root): `{report['command']}`",
        "",
        f"Machine: {machine['cpus']} cores, load average {machine['loadavg_before'][0]:.1f} before and "
        f"{machine['loadavg_after'][0]:.1f} after; {machine['note']}. Wall time {report['wall_s']:.0f} s. "
        f"Before measuring, both variants returned equal boxes for every benchmark request "
        f"({report['boxes_compared_equal']} boxes). Server restarts after a crash: {report['server_restarts']}. Throughput in images/s (median over rounds); the ratio is "
        "fastpath / sync within each round, median over rounds (per-round values in brackets); client latency per "
        "request: perf_analyzer's p50 / p99, median over rounds. Workloads: see benchmarks/text_detection_cpu.py.",
        "",
        table(report["rows"]),
        "",
    ])


def run(args) -> dict:
    """Both variants, each in its own tritonserver (both up for the whole run, one idle while the other is
    measured), so a crash of one cannot end the other's measurement; a server found dead is restarted and
    counted. Triton 2.51 can fail under this load (a stub reported unhealthy; a SIGSEGV in
    libtriton_python.so with boost::interprocess::lock_exception; see docs/benchmarks/text_detection_cpu.md)."""
    from conftest import start_server

    cells: dict = {}
    with tempfile.TemporaryDirectory(prefix="fastpath-detbench-") as tmp:
        servers: dict = {}
        restarts = {variant: 0 for variant in VARIANTS}

        def ensure_up(variant: str) -> None:
            """(Re)start the variant's server if it is not serving (counted in ``server_restarts``)."""
            if variant in servers and servers[variant].is_ready():
                return
            if variant in servers:
                restarts[variant] += 1
                print(f"{variant}: server not ready (died?); restarting it", flush=True)
                servers.pop(variant).stop()
            root = Path(tmp) / f"{variant}-{restarts[variant]}"
            root.mkdir()
            servers[variant] = start_server(root, models=(VARIANTS[variant],), repository=build_repository(root))

        try:
            for variant in VARIANTS:
                ensure_up(variant)
            compared = sum(check_equal(servers, workload_requests(name)) for name in WORKLOADS)
            for workload in args.workloads:
                requests = workload_requests(workload)
                for concurrency in args.concurrency:
                    key = f"{workload}@{concurrency}"
                    cells[key] = [measure_round(servers, ensure_up, requests, concurrency, index, args, Path(tmp))
                                  for index in range(args.rounds)]
                    for index, cell in enumerate(cells[key]):
                        print(f"{key} round {index}: " + "  ".join(
                            f"{v} {c['images_per_s']:.2f} img/s ({c['errors']} errors)" for v, c in cell.items())
                              + f"  fastpath images/call {cell['fastpath']['images_per_call']:.2f}", flush=True)
        finally:
            for server in servers.values():
                server.stop()
            for log in sorted(Path(tmp).glob("*/tritonserver.log")):
                text = log.read_text(errors="replace")
                if "Signal (11)" in text or "not healthy" in text or "Traceback" in text:
                    print(log.parent.name, "\n".join(line for line in text.splitlines()
                                                     if not line.startswith(("I1", "W1", "|", "+")))[-3000:])
    return {"cells": cells, "boxes_compared": compared, "server_restarts": restarts}


def measure_round(servers: dict, ensure_up, requests: list[np.ndarray], concurrency: int, index: int, args,
                  workdir: Path) -> dict:
    """Both variants back to back (order alternates by round); FastPath's images per engine call from its metrics."""
    cell = {}
    for variant in (list(VARIANTS) if index % 2 == 0 else list(VARIANTS)[::-1]):
        ensure_up(variant)
        metrics_url = f"http://127.0.0.1:{servers['fastpath'].options.metrics_port}/metrics"
        calls, images = batch_stats(metrics_url)
        cell[variant] = load(servers[variant].grpc_url, VARIANTS[variant], requests, concurrency, args.window_ms,
                             workdir / f"{variant}_c{concurrency}_round{index}.csv")
        calls_after, images_after = batch_stats(metrics_url)
        cell[variant]["images_per_call"] = (images_after - images) / (calls_after - calls) if calls_after > calls else 0.0
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-ms", type=int, default=4000, help="perf_analyzer's measurement window")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "text_detection_cpu")
    args = parser.parse_args(argv)
    started, load_before = time.time(), os.getloadavg()
    result = run(args)
    rows = summarize(result["cells"])
    report = {
        "command": " ".join([".venv/bin/python benchmarks/text_detection_cpu.py"] + (argv if argv is not None else sys.argv[1:])),
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "note": "2-core machine; the client runs on the same cores; "
                            "compare ratios within a round"},
        "workloads": {name: {"files": files, "images_per_request": n} for name, (files, n) in WORKLOADS.items()},
        "settings": {"rounds": args.rounds, "window_ms": args.window_ms},
        "boxes_compared_equal": result["boxes_compared"],
        "server_restarts": result["server_restarts"],
        "wall_s": time.time() - started,
        "rows": rows,
        "raw_cells": result["cells"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(report, indent=2) + "\n"), (".md", markdown(report))):
        args.out.with_suffix(suffix).write_text(text)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
