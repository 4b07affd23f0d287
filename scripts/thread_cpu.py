"""Where the CPU of one served request goes at concurrency 32: per process and per thread, in ms per request.

Run from the repository root with the artifacts built (about 1 minute, nothing else running):

    .venv/bin/python scripts/thread_cpu.py
    .venv/bin/python scripts/thread_cpu.py --model naive_embedding --repeats 2

Starts one tritonserver on the benchmark repository of ``benchmarks/scheduler_cpu.py`` serving
``--model``, drives it with ``--concurrency`` closed-loop tritonclient gRPC clients (one pydoc sentence
per request, the benchmark's client: ``scripts/client_cost_probe.py``), and reads every thread's user +
system CPU seconds (psutil, /proc) before and after a ``--seconds`` window. Prints texts/s and CPU
milliseconds per request: the client (this process), tritonserver, and each thread of the model's
python-backend stub, named by its Python thread name (``py-spy dump``, when py-spy is installed).

On 2026-11-30 (ninth session, dev machine; docs/benchmarks/thread_cpu_ninth.log) the shipped
``text_embedding`` at c=32 spent ~7.2 ms of CPU per request: its two engine lanes 6.1-6.5, the stub's
other threads 0.41-0.47 (execute() 0.23-0.24, the completion thread 0.12-0.13, the stager 0.05-0.07),
tritonserver 0.26-0.28 and the client 0.34-0.36 (docs/benchmarks/scheduler_cpu_runs.md, "ninth session").
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))


def thread_seconds(pid: int) -> dict[int, float]:
    """{thread id: user + system CPU seconds} of ``pid``; {} once it has exited."""
    try:
        return {thread.id: thread.user_time + thread.system_time for thread in psutil.Process(pid).threads()}
    except psutil.NoSuchProcess:
        return {}


def thread_names(pid: int) -> dict[int, str]:
    """{native thread id: Python thread name} from ``py-spy dump`` ({} without py-spy)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return {}
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    return {int(tid): name for tid, name in re.findall(r'^Thread (\d+) \(\w+\): "([^"]+)"', dump, flags=re.M)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="text_embedding")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)

    from client_cost_probe import Loop
    from conftest import start_server
    from cpu_meter import cpu_seconds
    from scheduler_cpu import build_repository, workload_texts

    texts = workload_texts()
    me = psutil.Process()
    with tempfile.TemporaryDirectory(prefix="fastpath-threads-") as tmp:
        server = start_server(Path(tmp), models=(args.model,), repository=build_repository(Path(tmp)))
        try:
            async def measure() -> None:
                loop = Loop(server.grpc_url, texts, [args.model])
                try:
                    await loop.run("tritonclient", args.model, args.concurrency, 1.0, 3.0)  # warm-up
                    # long-lived children only (the stub watcher's one-second `sleep`s come and go)
                    processes = {child.pid: child.name() for child in me.children(recursive=True)
                                 if child.name() in ("tritonserver", "triton_python_backend_stub")}
                    stubs = [pid for pid, name in processes.items() if name != "tritonserver"]
                    for _ in range(args.repeats):
                        before = {pid: thread_seconds(pid) for pid in processes}
                        client_before = cpu_seconds(me)
                        cell = await loop.run("tritonclient", args.model, args.concurrency, 0.0, args.seconds)
                        after = {pid: thread_seconds(pid) for pid in processes}
                        client_s = cpu_seconds(me) - client_before
                        names = {tid: name for pid in stubs for tid, name in thread_names(pid).items()}
                        requests = max(1, cell["texts_per_s"] * args.seconds)
                        print(f"\n{args.model} at c={args.concurrency}: {cell['texts_per_s']:.1f} texts/s, "
                              f"errors {cell['errors']}; CPU ms per request:")
                        print(f"  client (this process)              {1e3 * client_s / requests:7.3f}")
                        for pid, name in processes.items():
                            used = {tid: seconds - before[pid].get(tid, 0.0) for tid, seconds in after[pid].items()}
                            print(f"  {name} {pid:<8d}{'':{max(0, 26 - len(name))}s}{1e3 * sum(used.values()) / requests:7.3f}")
                            if pid in stubs:
                                for tid, seconds in sorted(used.items(), key=lambda kv: -kv[1]):
                                    if seconds * 1e3 / requests >= 0.005:
                                        print(f"      {names.get(tid, str(tid)):32s}{1e3 * seconds / requests:7.3f}")
                finally:
                    await loop.close()

            asyncio.run(measure())
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
