"""What a served benchmark reads from the processes beside it on the device machine: CPU seconds per process
group (tritonserver, each model's stubs, the load generator, the machine), py-spy recordings and dumps of a stub,
device memory per process (nvidia-smi), and a model's samples on Triton's metrics port.

Used by benchmarks/gpu/served_gpu.py, served_detection_gpu.py, grpc_load.py, reload_memory.py and soak_parts.py.
Linux only (``/proc``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far; 0.0 if it is gone."""
    from thread_cpu import stat_usage  # beside this file

    try:
        return stat_usage(Path(f"/proc/{pid}/stat"))[1]
    except (OSError, IndexError, ValueError):
        return 0.0


def stub_pids() -> dict[int, str]:
    """pid -> model name of every python-backend stub (its command line names the model instance)."""

    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"triton_python_backend_stub"):
            names = [a.decode() for a in argv if re.fullmatch(rb"[A-Za-z][\w.-]*_\d+_\d+", a)]
            found[int(entry.name)] = re.sub(r"_\d+_\d+$", "", names[-1]) if names else "?"
    return found


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class CpuAccount:
    """CPU seconds per process group over a load cell: tritonserver, each model's stubs, the load generator.

    Which limit binds first: a group whose CPU seconds per request, times the request
    rate, reaches its cores; or the whole machine at ~100% busy.
    """

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.stubs = stub_pids()
        self.start = self._snapshot()

    def _snapshot(self) -> dict:
        return {"server": proc_cpu_s(self.server_pid) if self.server_pid else 0.0,
                "stubs": {pid: proc_cpu_s(pid) for pid in self.stubs}, "machine": machine_busy()}

    def finish(self, requests: int, client_cpu_s: float, wall_s: float) -> dict:
        end = self._snapshot()
        per_model: dict[str, float] = {}
        for pid, model in self.stubs.items():
            per_model[model] = per_model.get(model, 0.0) + end["stubs"][pid] - self.start["stubs"][pid]
        busy = (end["machine"][0] - self.start["machine"][0]) / max(1, end["machine"][1] - self.start["machine"][1])
        n = max(1, requests)
        server_s = end["server"] - self.start["server"]
        stubs = {f"stubs:{m}": v for m, v in per_model.items() if v > 0.01 * wall_s}
        return {"machine_busy_pct": round(100 * busy, 1), "cpus": os.cpu_count(),
                "cores_used": {"tritonserver": round(server_s / wall_s, 2), "client": round(client_cpu_s / wall_s, 2),
                               **{k: round(v / wall_s, 2) for k, v in stubs.items()}},
                "cpu_us_per_request": {"tritonserver": round(server_s / n * 1e6, 1), "client": round(client_cpu_s / n * 1e6, 1),
                                       **{k: round(v / n * 1e6, 1) for k, v in stubs.items()}}}


def py_spy_binary() -> str | None:
    """The py-spy binary (PATH, next to this interpreter, or a site-packages bin/ of a --target install)."""
    candidates = [shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy")]
    candidates += [str(Path(p) / "bin" / "py-spy") for p in sys.path if p.endswith("site-packages")]
    return next((c for c in candidates if c and Path(c).exists()), None)


def py_spy_argv(binary: str, pid: int, seconds: float, out: Path, *, native: bool = False, gil: bool = False) -> list[str]:
    """``py-spy record`` of ``pid`` for ``seconds``: raw collapsed stacks at 250 Hz into ``out``, active samples only;
    ``native`` adds the C/C++ frames under each Python frame (py-spy then pauses the process for each sample);
    ``gil`` samples only the thread holding the GIL (with ``native``: no other thread is unwound, so a thread
    whose native stack cannot be unwound does not drop every sample)."""
    argv = [binary, "record", "--rate", "250", "--format", "raw", "--duration", str(int(seconds)), "--output", str(out),
            "--pid", str(pid), *(["--gil"] if gil else [])]
    return argv + ["--native"] if native else argv + ["--nonblocking"]


def py_spy_stderr(out: Path) -> Path:
    """Where :func:`start_py_spy` writes py-spy's stderr for a recording into ``out``."""
    return out.with_suffix(".stderr.txt")


def start_py_spy(model: str, seconds: float, out: Path, *, native: bool = False, gil: bool = False):
    """``py-spy record`` of one stub of ``model`` (:func:`py_spy_argv`), or None; its stderr goes to
    :func:`py_spy_stderr`."""
    binary = py_spy_binary()
    pid = next((pid for pid, name in stub_pids().items() if name == model), None)
    if binary is None or pid is None:
        print(f"py-spy: not started (binary {binary}, stub pid {pid})", flush=True)
        return None
    with open(py_spy_stderr(out), "wb") as errors:  # why a recording came back empty
        return subprocess.Popen(py_spy_argv(binary, pid, seconds, out, native=native, gil=gil), stdout=subprocess.DEVNULL, stderr=errors)


def gpu_memory_mib() -> tuple[dict[int, int], str | None]:
    """Device memory per process, MiB by pid (``nvidia-smi --query-compute-apps``), and None; or ({}, why) when
    nvidia-smi could not be run or failed."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {}, f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        return {}, f"nvidia-smi exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
    rows = [line.split(",") for line in done.stdout.splitlines() if "," in line]
    return {int(pid): int(used) for pid, used in rows if pid.strip().isdigit() and used.strip().isdigit()}, None


def model_metrics(port: int, model: str, prefix: str = "") -> dict[str, float]:
    """The metric samples of ``model`` on Triton's metrics port whose names start with ``prefix`` (Triton's ``nv_*``,
    FastPath's ``fastpath_*``: pool waits and fallbacks, batch sizes, queue delay, ...), summed over their other
    labels; histogram buckets left out."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for sample in text.splitlines():
        name = sample.split("{", 1)[0]
        if name.startswith(prefix) and not sample.startswith("#") and not name.endswith("_bucket") and f'model="{model}"' in sample:
            found[name] = found.get(name, 0.0) + float(sample.rsplit(" ", 1)[1])
    return found


def failure_state(port: int, model: str, log_path: Path) -> dict:
    """What the server held when a cell of ``model`` failed: Triton's pending, successful and failed requests of
    the model (``nv_inference_*`` on the metrics port; pending > 0 long after perf_analyzer stopped sending means
    answers that never came) and the last 1,500 characters of tritonserver's log."""
    state: dict = {}
    try:
        totals = model_metrics(port, model, "nv_inference_")
        state.update(pending_requests=totals.get("nv_inference_pending_request_count"),
                     successful_requests=totals.get("nv_inference_request_success"),
                     failed_requests=totals.get("nv_inference_request_failure"))
    except OSError as exc:
        state["metrics_error"] = f"{type(exc).__name__}: {exc}"
    state["log_tail"] = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
    return state


def metric_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters, sums and counts as the cell's increase; gauges as read after it."""
    counted = ("_total", "_sum", "_count")
    return {name: round(value - before.get(name, 0.0) if name.endswith(counted) else value, 6) for name, value in sorted(after.items())}


def py_spy_dumps(model: str, out: list, count: int = 3, delay_s: float = 2.0) -> None:
    """``py-spy dump`` (every thread, idle ones too) of ``model``'s stub ``count`` times, 1 s apart, into ``out``."""
    time.sleep(delay_s)
    binary = py_spy_binary()
    pid = next((pid for pid, name in stub_pids().items() if name == model), None)
    for _ in range(count if binary and pid else 0):
        done = subprocess.run([binary, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False)
        out.append((done.stdout + done.stderr)[-12000:])
        time.sleep(1.0)


def summarize_py_spy(path: Path, top: int = 25) -> dict:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    self_counts: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].split(":")[0].rstrip(")") for f in stack.split(";")[1:]]
        total += int(count)
        if frames:
            self_counts[frames[-1]] = self_counts.get(frames[-1], 0) + int(count)
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    def share(table: dict) -> list:
        return [(name, round(100 * n / max(1, total), 1)) for name, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "self_pct": share(self_counts), "inclusive_pct": share(inclusive)}
