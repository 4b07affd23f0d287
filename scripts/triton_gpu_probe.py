"""Diagnose the H200 stall: which request source gets no answer, and what the stub is doing then.

Run on the device machine after ``scripts/gpu_setup.sh`` (docs/benchmarks/triton_gpu.md):

    FASTPATH_TRITON_DIR=/tmp/g/pytriton/tritonserver /tmp/venv/bin/python scripts/triton_gpu_probe.py --out $OUT

Starts text_embedding (torch runtime, CUDA graphs, scheduler) under tritonserver with
``--log-verbose=1`` and sends one-text gRPC requests from different sources, each with a 10 s
deadline: the main client, a new client in a thread, a spawned process, a fresh interpreter, and 16
threads at once. At the first request with no answer it records the stub processes' threads
(``ps``), their Python stacks (``py-spy dump``, no GIL needed) and a faulthandler dump (SIGUSR1),
then goes on. Writes ``probe.json``, ``tritonserver.log`` (tail) and ``stacks.txt`` under --out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

TEXT = "The quick brown fox jumps over the lazy dog near the river bank."


def one_request(url: str, text: str = TEXT, timeout_s: float = 10.0) -> tuple[bool, float, str]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    start = time.perf_counter()
    try:
        client.infer("text_embedding", [tensor], client_timeout=timeout_s)
        return True, time.perf_counter() - start, ""
    except Exception as exc:
        return False, time.perf_counter() - start, str(exc)[:200]
    finally:
        client.close()


def _spawned(url: str, queue) -> None:
    queue.put(one_request(url))


def stub_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "triton_python_backend_stub"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def diagnose(label: str, out: Path) -> dict:
    """Threads and Python stacks of every stub, without needing the stub's GIL."""
    record: dict = {"when": label, "stubs": {}}
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    site_bin = [p for p in sys.path if p.endswith("site-packages")]
    for candidate in [py_spy] + [str(Path(p) / "bin" / "py-spy") for p in site_bin]:
        if Path(candidate).exists():
            py_spy = candidate
            break
    for pid in stub_pids():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        threads = subprocess.run(["ps", "-L", "-o", "tid,stat,pcpu,wchan:32,comm", "-p", str(pid)],
                                 capture_output=True, text=True).stdout
        dump = subprocess.run([py_spy, "dump", "--pid", str(pid), "--locals"], capture_output=True, text=True, timeout=60)
        record["stubs"][pid] = {"cmdline": cmdline, "threads": threads.splitlines(),
                                "py_spy": (dump.stdout + dump.stderr).splitlines()[:400]}
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError as exc:
            record["stubs"][pid]["sigusr1"] = str(exc)
    (out / f"diagnose_{label}.json").write_text(json.dumps(record, indent=1))
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version-dir", type=Path, default=ROOT / "model_repository" / "text_embedding" / "1")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("probe_out"))
    parser.add_argument("--extra", default="", help="extra config.pbtxt parameters, k=v,k=v")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["FASTPATH_STACK_DUMP"] = str((args.out / "stacks.txt").resolve())
    from triton_gpu import make_repository

    from fastpath.server.process import ServerOptions, TritonServer
    from tests.conftest import free_ports

    root = Path(tempfile.mkdtemp(prefix="triton-probe-"))
    repository = make_repository(root, args.version_dir, device=args.device, precision="fp16",
                                 instances=args.instances, delay_us=500)
    config = repository / "text_embedding" / "config.pbtxt"
    for pair in filter(None, args.extra.split(",")):
        key, value = pair.split("=", 1)
        text = config.read_text()
        text = "\n".join(line for line in text.splitlines() if f'key: "{key}"' not in line) + "\n"
        config.write_text(text + f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n')
    http_port, grpc_port, metrics_port = free_ports(3)
    log = root / "tritonserver.log"
    server = TritonServer(ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port,
                                        metrics_port=metrics_port, host="127.0.0.1", exit_timeout_s=5, log_verbose=1),
                          log_path=log)
    report: dict = {"command": " ".join(sys.argv), "steps": []}
    server.start()
    diagnosed = [False]

    def step(name: str, results: list[tuple[bool, float, str]]) -> None:
        ok = sum(1 for r in results if r[0])
        row = {"step": name, "ok": ok, "failed": len(results) - ok,
               "ms": [round(r[1] * 1e3, 2) for r in results[:8]], "errors": sorted({r[2] for r in results if r[2]})[:3]}
        report["steps"].append(row)
        print(json.dumps(row), flush=True)
        if row["failed"] and not diagnosed[0]:
            diagnosed[0] = True
            report["diagnosis"] = diagnose(name.replace(" ", "_"), args.out)
            print(json.dumps(report["diagnosis"], indent=1)[:6000], flush=True)

    try:
        server.wait_ready(timeout_s=400)
        url = server.grpc_url
        import tritonclient.grpc as grpcclient

        main_client = grpcclient.InferenceServerClient(url)

        def main_one():
            tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=np.object_))
            start = time.perf_counter()
            try:
                main_client.infer("text_embedding", [tensor], client_timeout=10)
                return True, time.perf_counter() - start, ""
            except Exception as exc:
                return False, time.perf_counter() - start, str(exc)[:200]

        def main_with(texts, outputs=None):
            tensor = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
            wanted = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
            start = time.perf_counter()
            try:
                main_client.infer("text_embedding", [tensor], outputs=wanted, client_timeout=10)
                return True, time.perf_counter() - start, ""
            except Exception as exc:
                return False, time.perf_counter() - start, str(exc)[:200]

        step("main client x5", [main_one() for _ in range(5)])
        step("requested output EMBEDDING x5", [main_with([TEXT], ["EMBEDDING"]) for _ in range(5)])
        step("main client x5 (2)", [main_one() for _ in range(5)])
        from fastpath.text.corpus import pydoc_sentences

        sample = pydoc_sentences()[:61] + ["", "hello world", "word " * 400]
        step("64 mixed texts", [main_with(sample)])
        step("main client x5 (3)", [main_one() for _ in range(5)])
        step("100 sequential real texts", [main_with([t]) for t in pydoc_sentences()[:100]])
        step("new client, main thread", [one_request(url)])
        box: list = []
        worker = threading.Thread(target=lambda: box.append(one_request(url)))
        worker.start()
        worker.join()
        step("new client, new thread", box)
        queue = mp.get_context("spawn").Queue()
        process = mp.get_context("spawn").Process(target=_spawned, args=(url, queue))
        process.start()
        try:
            step("spawned process", [queue.get(timeout=60)])
        except Exception as exc:
            step("spawned process", [(False, 60.0, f"no result: {exc}")])
        process.join(10)
        code = (f"import sys; sys.path[:0]={[str(ROOT / 'scripts')]!r}; from triton_gpu_probe import one_request; "
                f"print(repr(one_request({url!r})))")
        fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        try:
            step("fresh interpreter", [eval(fresh.stdout.strip().splitlines()[-1])])
        except Exception:
            step("fresh interpreter", [(False, 0.0, (fresh.stdout + fresh.stderr)[-200:])])
        results: list = []
        threads = [threading.Thread(target=lambda: results.append(one_request(url))) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        step("16 threads at once", results)
        step("main client after", [main_one() for _ in range(3)])
        if not diagnosed[0]:
            diagnose("end", args.out)
        stats = main_client.get_inference_statistics("text_embedding", as_json=True)
        report["triton_statistics"] = stats["model_stats"][0]["inference_stats"]
        time.sleep(16)  # let FASTPATH_STACK_DUMP's 15 s faulthandler timer write once
    finally:
        server.stop()
        text = log.read_text(errors="replace")
        (args.out / "tritonserver.log").write_text(text[-3_000_000:])
    (args.out / "probe.json").write_text(json.dumps(report, indent=1) + "\n")
    for row in report["steps"]:
        print(f"{row['step']:<28} ok {row['ok']:>3} failed {row['failed']:>3} ms {row['ms'][:4]} {row['errors'][:1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
