"""System shared memory vs binary tensors in the request body, for 32 large images.

Starts a real tritonserver with the ``probe`` model of tests/e2e/test_client_probe.py (input IMAGES
uint8 [N, H, W, 3], output SUM int64 [N]: a large input and a small output, like text detection) and
sends the same 32 RGB images of 640x640 (39 MB in all), both as one [32, 640, 640, 3] request and as
32 requests of one image, through ``fastpath_client.Client`` with ``shared_memory="never"`` (binary
tensor data in the HTTP body / gRPC message) and ``"always"`` (a system shared-memory region per
request, registered, used, unregistered and unlinked). Variants run interleaved, round after round, so
that the noise of a shared 2-core machine falls on all of them alike; the table gives medians and
ratios to binary HTTP, and the server's own compute_infer time per round (the same work in every
variant) so the transport part can be read off.

With ``--detection`` it also runs ``Client.detect_text`` on the same 32 images through the real
``text_detection`` model (one image per request), binary vs shared memory over HTTP: there the
model's own compute dominates, which puts the transport saving in proportion.

    .venv/bin/python benchmarks/client_shm.py [--rounds 7] [--detection] [--out docs/benchmarks/client_shm.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from fastpath_client import Client  # noqa: E402
from fastpath_client.shm import leaked_regions  # noqa: E402
from tests.conftest import start_server  # noqa: E402
from tests.e2e.test_client_probe import write_probe_repository  # noqa: E402

VARIANTS = [("http", "never"), ("http", "always"), ("grpc", "never"), ("grpc", "always")]


def _round(client: Client, images: np.ndarray, batched: bool) -> tuple[float, float]:
    """Seconds for one round (32 images) and the server's compute_infer seconds in it."""
    before = client.statistics("probe")["compute_infer"][1]
    start = time.perf_counter()
    if batched:
        sums = client.infer("probe", {"IMAGES": images})["SUM"]
    else:
        sums = np.concatenate([client.infer("probe", {"IMAGES": images[i : i + 1]})["SUM"] for i in range(len(images))])
    elapsed = time.perf_counter() - start
    assert sums.tolist() == images.reshape(len(images), -1).sum(axis=1, dtype=np.int64).tolist()
    return elapsed, (client.statistics("probe")["compute_infer"][1] - before) / 1e9


def measure(server, images: np.ndarray, rounds: int) -> list[dict]:
    clients = {v: Client(server.http_url if v[0] == "http" else server.grpc_url, v[0], shared_memory=v[1],
                         timeout_s=120) for v in VARIANTS}
    times = {(v, b): [] for v in VARIANTS for b in (True, False)}
    try:
        for batched in (True, False):
            for v in VARIANTS:  # warm-up: connections, first mmap
                _round(clients[v], images, batched)
            for _ in range(rounds):
                for v in VARIANTS:
                    times[(v, batched)].append(_round(clients[v], images, batched))
    finally:
        for client in clients.values():
            client.close()
    assert leaked_regions() == [], leaked_regions()
    rows = []
    for (variant, batched), samples in times.items():
        baseline = statistics.median(t for t, _ in times[(("http", "never"), batched)])
        median = statistics.median(t for t, _ in samples)
        rows.append({"protocol": variant[0], "tensors": "shared memory" if variant[1] == "always" else "binary",
                     "requests": 1 if batched else len(images), "median_s": median,
                     "server_compute_infer_s": statistics.median(c for _, c in samples),
                     "speedup_vs_binary_http": baseline / median, "samples_s": [t for t, _ in samples]})
    return rows


def measure_detection(images: np.ndarray, rounds: int) -> list[dict]:
    """detect_text on 32 images through text_detection over HTTP: binary vs shared memory, interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), models=("text_detection",))
        clients = {mode: Client(server.http_url, shared_memory=mode, timeout_s=300) for mode in ("never", "always")}
        times = {mode: [] for mode in clients}
        try:
            reference = clients["never"].detect_text(list(images))  # warm-up, and the boxes to compare
            for mode in ("always",):
                same = clients[mode].detect_text(list(images))
                assert all(np.allclose(a.boxes, b.boxes, atol=1e-3) for a, b in zip(reference, same))
            for _ in range(rounds):
                for mode, client in clients.items():
                    start = time.perf_counter()
                    client.detect_text(list(images))
                    times[mode].append(time.perf_counter() - start)
        finally:
            for client in clients.values():
                client.close()
            server.stop()
    baseline = statistics.median(times["never"])
    return [{"protocol": "http", "tensors": "shared memory" if mode == "always" else "binary", "requests": len(images),
             "model": "text_detection", "median_s": statistics.median(t), "server_compute_infer_s": float("nan"),
             "speedup_vs_binary_http": baseline / statistics.median(t), "samples_s": t} for mode, t in times.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--side-px", type=int, default=640)
    parser.add_argument("--detection", action="store_true", help="also time detect_text through text_detection")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "client_shm.json")
    args = parser.parse_args()
    images = np.random.default_rng(0).integers(0, 256, (32, args.side_px, args.side_px, 3), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), models=("probe",), repository=write_probe_repository(Path(tmp) / "repo"))
        try:
            rows = measure(server, images, args.rounds)
        finally:
            server.stop()
    for row in rows:
        row["model"] = "probe"
    if args.detection:
        rows += measure_detection(images, max(2, args.rounds // 3))
    table = [f"32 images of {args.side_px}x{args.side_px}x3 uint8 ({images.nbytes / 1e6:.1f} MB), medians of "
             f"{args.rounds} rounds (text_detection: {max(2, args.rounds // 3)})",
             f"{'model':>14} {'protocol':>8} {'tensors':>14} {'requests':>8} {'median ms':>10} "
             f"{'server infer ms':>15} {'vs binary HTTP':>14}"]
    for r in rows:
        table.append(f"{r['model']:>14} {r['protocol']:>8} {r['tensors']:>14} {r['requests']:>8} "
                     f"{r['median_s'] * 1e3:10.1f} {r['server_compute_infer_s'] * 1e3:15.1f} "
                     f"{r['speedup_vs_binary_http']:13.2f}x")
    print("\n".join(table))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "client_shm", "host": platform.node(), "cpus": os.cpu_count(),
              "images": [32, args.side_px, args.side_px, 3], "bytes": int(images.nbytes), "rounds": args.rounds,
              "table": table, "rows": rows}
    args.out.write_text(json.dumps(report, indent=2).replace("NaN", "null") + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
