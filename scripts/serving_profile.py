"""Where the serving path's CPU goes: a system-wide ``perf`` profile while one model serves a closed loop.

Run from the repository root with the artifacts built and ``perf`` installed (Linux; needs root or
``kernel.perf_event_paranoid`` <= 0 for ``-a``):

    .venv/bin/python scripts/serving_profile.py --model text_embedding --seconds 15

Starts one tritonserver on the benchmark repository of ``benchmarks/scheduler_repository.py`` (the shipped
text_embedding, its variants, and the baselines), warms ``--model`` for 3 s, then records
``perf record -a -F 499`` (no call graphs: Python 3.11 frames do not resolve in perf) for
``--seconds`` while perf_analyzer keeps ``--concurrency`` gRPC requests of one text each in flight. Prints the share
of samples by process and by process x shared object x symbol (top ``--top``), and writes them as
JSON to ``--out`` when given. What it is for: finding per-request CPU outside the engine (IPC,
futex wake-ups, the interpreter) that ``benchmarks/serving_cpu.py`` only totals per process.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from scheduler_cpu import load, workload_texts  # noqa: E402
from scheduler_repository import FASTPATH_VARIANTS, build_repository  # noqa: E402
from serving_cpu import components  # noqa: E402


def perf_samples(data: Path) -> list[tuple[str, str, str]]:
    """(command, shared object, symbol) of every sample in a ``perf.data``."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    samples = []
    for line in out.splitlines():
        line = line.strip()
        if not line:
            continue
        # "<comm> <ip> <symbol> (<dso>)"; a comm may hold spaces, the ip is the first hex word after it.
        head, _, dso = line.rpartition(" (")
        match = re.match(r"(.*?)\s+([0-9a-f]+)\s+(.*)$", head)
        comm, sym = (match.group(1), match.group(3)) if match else (head, "?")
        samples.append((comm.strip(), dso.rstrip(")").rsplit("/", 1)[-1], sym.strip()))
    return samples


def print_py_spy(path: Path, top: int) -> None:
    """Functions by share of py-spy samples they appear in (inclusive), from py-spy's raw (collapsed) output."""
    inclusive: collections.Counter = collections.Counter()
    leaf: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f.split(" (")[0] for f in stack.split(";")]
        total += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
        leaf[frames[-1]] += int(count)
    print(f"\npy-spy, stub, {total} samples of non-idle threads; functions by inclusive share:")
    for frame, n in inclusive.most_common(top):
        print(f"  {100 * n / total:5.1f}%  (self {100 * leaf[frame] / total:4.1f}%)  {frame}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="text_embedding",
                        choices=["text_embedding", "naive_embedding", "echo_embedding", *sorted(FASTPATH_VARIANTS)])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--py-spy", action="store_true",
                        help="also sample the model's stub with py-spy (Python stacks, non-idle threads, 200 Hz) "
                             "and print the functions found in most samples")
    args = parser.parse_args(argv)

    from conftest import start_server

    texts = workload_texts()
    with tempfile.TemporaryDirectory(prefix="fastpath-profile-") as tmp:
        server = start_server(Path(tmp), models=(args.model,), repository=build_repository(Path(tmp)))
        try:
            load(server.grpc_url, args.model, texts, args.concurrency, 0.0, 3.0)
            data = Path(tmp) / "perf.data"
            perf = subprocess.Popen(["perf", "record", "-a", "-F", "499", "-o", str(data)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            spy = None
            if args.py_spy:
                stub = components(server.pid, (args.model,))[f"stub:{args.model}"][0]
                spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking", "-r", "200",
                                        "-d", str(int(args.seconds)), "-f", "raw", "-o", str(Path(tmp) / "spy.txt"),
                                        "-p", str(stub.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            cell = load(server.grpc_url, args.model, texts, args.concurrency, 0.0, args.seconds)
            perf.send_signal(2)
            perf.wait(timeout=60)
            samples = perf_samples(data)
            if spy is not None:
                spy.wait(timeout=60)
                print_py_spy(Path(tmp) / "spy.txt", args.top)
        finally:
            server.stop()
    total = len(samples)
    by_comm = collections.Counter(comm for comm, _, _ in samples)
    by_dso = collections.Counter((comm, dso) for comm, dso, _ in samples)
    by_sym = collections.Counter(samples)
    print(f"{args.model} at concurrency {args.concurrency}: {cell['throughput_per_s']:.1f} texts/s, {total} samples")
    print("\nby thread name:")
    for comm, n in by_comm.most_common(15):
        print(f"  {100 * n / total:5.1f}%  {comm}")
    print("\nby thread x shared object:")
    for (comm, dso), n in by_dso.most_common(25):
        print(f"  {100 * n / total:5.1f}%  {comm:<16} {dso}")
    print(f"\ntop {args.top} (thread, object, symbol):")
    for (comm, dso, sym), n in by_sym.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {comm:<16} {dso:<28} {sym[:70]}")
    if args.out:
        args.out.write_text(json.dumps({
            "command": " ".join([".venv/bin/python scripts/serving_profile.py"] + (argv or sys.argv[1:])),
            "texts_per_s": round(cell["throughput_per_s"], 1), "samples": total,
            "by_thread": {c: round(n / total, 4) for c, n in by_comm.most_common()},
            "by_thread_object": [{"thread": c, "object": d, "share": round(n / total, 4)} for (c, d), n in by_dso.most_common(40)],
            "top": [{"thread": c, "object": d, "symbol": s, "share": round(n / total, 4)}
                    for (c, d, s), n in by_sym.most_common(args.top)]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
