"""The running parts of the soak (benchmarks/gpu/soak.py): the product as a user starts it, the version probe,
Triton's request counts, the memory sampler and the perf_analyzer load in back-to-back segments.

Each background part is a thread with ``stop()``; every time is seconds on the soak's clock (:class:`Clock`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for path in (ROOT, ROOT / "benchmarks", HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import perf_analyzer as pa  # noqa: E402
import stub_probes  # noqa: E402  (nvidia-smi's memory per process)
from soak_checks import MonotoneCounter, Response, Segment  # noqa: E402

MODEL = "text_embedding"
SERVED_MODELS = (MODEL, "fastpath_admin")  # fastpath_admin answers swap and status
RESTART_PAUSE_S = 1.0  # between a perf_analyzer run that ended on its own and the next
STOP_TIMEOUT_S = 15.0  # for perf_analyzer to end after SIGINT: longer means requests it sent were never answered
PROBE_TIMEOUT_S = 15.0  # a probe request's deadline (a request inside a killed stub is never answered)


class SoakError(RuntimeError):
    """The soak cannot go on: the server did not become ready, exited, or its admin key is missing."""


class Clock:
    """Seconds since ``start()`` on CLOCK_MONOTONIC."""

    def __init__(self) -> None:
        self.origin = time.monotonic()

    def start(self) -> None:
        self.origin = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.origin


def _interrupt_with_parent() -> None:  # in the child, before exec: SIGINT (a clean stop) if the soak dies
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


def _children(pid: int, name: str) -> list[int]:
    """Pids of the processes called ``name`` whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if comm == name and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


class ServedProduct:
    """``python -m fastpath serve --device DEVICE --model text_embedding --model fastpath_admin`` on free ports
    (``HTTP_PORT``/``GRPC_PORT``/``METRICS_PORT``, as ``make serve`` passes them), its own session, a fresh
    serving-version record directory (``FASTPATH_VERSION_STATE_DIR``: a soak leaves the repository's record
    alone), output to ``log_path``, plus ``env``'s variables. The admin key is the one ``fastpath serve`` generated
    and wrote (``fastpath.cli.common.admin_key_file``), or ``FASTPATH_ADMIN_KEY`` when the environment sets one."""

    def __init__(self, device: str, workdir: Path, ready_timeout_s: float, env: dict[str, str] | None = None) -> None:
        from tests.conftest import free_ports

        self.device, self.workdir, self.ready_timeout_s, self.extra_env = device, workdir, ready_timeout_s, env or {}
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.http_url, self.grpc_url = f"127.0.0.1:{self.http_port}", f"127.0.0.1:{self.grpc_port}"
        self.log_path = workdir / "serve.log"
        self.process: subprocess.Popen | None = None
        self.triton_pid: int | None = None
        self.admin_key = ""

    def command(self) -> list[str]:
        models = [flag for model in SERVED_MODELS for flag in ("--model", model)]
        return [sys.executable, "-m", "fastpath", "serve", "--device", self.device, "--host", "127.0.0.1", *models,
                "--ready-timeout-s", str(self.ready_timeout_s)]

    def described(self) -> str:
        """The command as a user would type it."""
        return "python " + " ".join(self.command()[1:])

    def start(self) -> ServedProduct:
        """Start it and wait until both models are ready and the admin key is known.

        Raises:
            SoakError: it exited or was not ready within ``ready_timeout_s`` (the message ends with its log's last lines).
        """
        env = dict(os.environ, HTTP_PORT=str(self.http_port), GRPC_PORT=str(self.grpc_port), METRICS_PORT=str(self.metrics_port),
                   FASTPATH_VERSION_STATE_DIR=str(self.workdir / "version_state"), PYTHONUNBUFFERED="1", **self.extra_env)
        started = time.time()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                            start_new_session=True, preexec_fn=_interrupt_with_parent)
        self._wait_ready(time.monotonic() + self.ready_timeout_s + 30, started)
        return self

    def _wait_ready(self, deadline: float, started: float) -> None:
        from fastpath.cli.common import admin_key_file
        from fastpath.server.triton_api import RepositoryApi

        api, key_file = RepositoryApi(self.http_url), admin_key_file(self.http_port)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SoakError(f"`{self.described()}` exited with code {self.process.returncode} before it "
                                f"was ready; {self.log_path} ends:\n{self.log_tail()}")
            fresh = key_file.is_file() and key_file.stat().st_mtime >= started - 1  # not a key an earlier server left
            self.admin_key = os.environ.get("FASTPATH_ADMIN_KEY") or (key_file.read_text().strip() if fresh else "")
            if self.admin_key and all(api.is_loaded(model) for model in SERVED_MODELS):
                self.triton_pid = (_children(self.process.pid, "tritonserver") or [None])[0]
                if self.triton_pid is not None:
                    return
            time.sleep(0.5)
        raise SoakError(f"`{self.described()}` was not ready (models {', '.join(SERVED_MODELS)}, admin key in "
                        f"{key_file}) within {self.ready_timeout_s:.0f} s; {self.log_path} ends:\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(unreadable: {exc})"

    def stubs(self) -> list:
        """The live python-backend stubs of text_embedding (:class:`fastpath.server.stubs.Stub`)."""
        from fastpath.server.process import group_members
        from fastpath.server.stubs import list_stubs

        return [s for s in list_stubs(group_members(self.triton_pid)) if s.model == MODEL] if self.triton_pid else []

    def stop(self, timeout_s: float = 120.0) -> int | None:
        """SIGINT, as Ctrl-C would (``fastpath serve`` unloads the models and stops tritonserver); SIGKILL to both
        process groups (``fastpath serve``'s session, tritonserver's with its stubs) if it has not exited in
        ``timeout_s``. Idempotent; returns its exit code."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        from fastpath.server.process import group_members

        if self.triton_pid is not None and group_members(self.triton_pid):
            try:
                os.killpg(self.triton_pid, signal.SIGKILL)  # stubs a crash left behind; nothing when it stopped cleanly
            except (ProcessLookupError, PermissionError):
                pass
        return process.returncode


class Worker(threading.Thread):
    """A daemon thread with a stop event; ``failure`` holds the exception that ended ``work`` early, if any."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.failure: str | None = None

    def run(self) -> None:
        try:
            self.work()
        except Exception as exc:  # noqa: BLE001 - reported with the results; the soak goes on without this part
            self.failure = f"{type(exc).__name__}: {exc}"

    def work(self) -> None:
        raise NotImplementedError

    def stop(self, timeout_s: float = 90.0) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(timeout_s)


def one_text(client, text: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int | None, str | None]:
    """One gRPC request of ``text`` to text_embedding (``client``: tritonclient.grpc's); (its MODEL_VERSION, None)
    or (None, the error's message)."""
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    try:
        reply = client.infer(MODEL, [tensor], outputs=[grpcclient.InferRequestedOutput("MODEL_VERSION")], client_timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - a failed request is a result: its message is returned
        return None, " ".join(str(exc).split())
    return int(reply.as_numpy("MODEL_VERSION").reshape(-1)[0]), None


class Admin:
    """``fastpath_admin`` over gRPC (tests/e2e/swap_support.admin: what ``fastpath swap --protocol grpc`` sends), with the
    admin key. Errors raise tritonclient's InferenceServerException."""

    def __init__(self, url: str, admin_key: str) -> None:
        self.url, self.admin_key = url, admin_key

    def status(self) -> dict:
        from tests.e2e.swap_support import admin

        return admin(self.url, {"command": "status", "model": MODEL}, protocol="grpc")

    def swap(self, version: int) -> dict:
        from tests.e2e.swap_support import admin

        return admin(self.url, {"command": "swap", "model": MODEL, "version": version, "key": self.admin_key}, protocol="grpc")


class Probe(Worker):
    """One gRPC request of one text every ``1 / rate_per_s`` seconds, recording each :class:`Response`."""

    def __init__(self, url: str, texts: list[str], rate_per_s: float, clock: Clock) -> None:
        super().__init__("soak-probe")
        self.url, self.texts, self.interval_s, self.clock = url, texts, 1.0 / rate_per_s, clock
        self.responses: list[Response] = []

    def work(self) -> None:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.url)
        next_s, index = self.clock(), 0
        while not self.stopping.wait(max(0.0, next_s - self.clock())):
            next_s = max(next_s + self.interval_s, self.clock())  # late: no burst to catch up
            sent_s = self.clock()
            version, error = one_text(client, self.texts[index % len(self.texts)])
            index += 1
            self.responses.append(Response(sent_s=sent_s, done_s=self.clock(), version=version, error=error))


class RequestCounter(Worker):
    """text_embedding's success and fail counts from Triton's statistics (gRPC ``url``) every ``poll_s``, summed
    across the resets a reload makes (:class:`soak_checks.MonotoneCounter`)."""

    def __init__(self, url: str, poll_s: float = 0.5) -> None:
        super().__init__("soak-request-counter")
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(url)
        self.poll_s = poll_s
        self.success, self.fail = MonotoneCounter(), MonotoneCounter()
        self._lock = threading.Lock()
        self.read()

    def read(self) -> tuple[int, int]:
        """Take a reading now (skipped while Triton has no such model, between an unload and a load); (success, fail)."""
        from tritonclient.utils import InferenceServerException

        with self._lock:
            try:
                versions = self.client.get_inference_statistics(MODEL, as_json=True, client_timeout=10)["model_stats"]
            except InferenceServerException:
                return self.success.total, self.fail.total
            counts = [sum(int(v["inference_stats"][phase].get("count", 0)) for v in versions) for phase in ("success", "fail")]
            return self.success.update(counts[0]), self.fail.update(counts[1])

    def work(self) -> None:
        while not self.stopping.wait(self.poll_s):
            self.read()


def process_rss_bytes(pid: int) -> int | None:
    """Resident bytes of ``pid`` (``/proc/PID/status`` VmRSS), None once it is gone."""
    from fastpath.memory import process_memory

    try:
        return process_memory(pid).rss_bytes
    except (OSError, TypeError):  # gone; a zombie has no VmRSS
        return None


SERIES_VERSION = " @ v"  # a stub's series: "stub <instance> pid <pid> @ v<serving version>"


def process_of(series: str) -> str:
    """The process of a :class:`Sampler` series: its name without the serving version."""
    return series.split(SERIES_VERSION)[0]


class Sampler(Worker):
    """Every ``every_s`` (and on ``sample()``): RSS of tritonserver and of each text_embedding stub (MiB), and
    each of those processes' GPU memory (MiB) when ``gpu`` is set. Keys name the process and its pid; a stub's
    also the version it serves (``serving()``; the two versions' engines may differ in size: fp32 and INT8 on the
    CPU), and its samples are skipped while ``serving()`` is None (a swap under way holds two engines)."""

    def __init__(self, product: ServedProduct, clock: Clock, every_s: float, gpu: bool, serving: Callable[[], int | None]) -> None:
        super().__init__("soak-sampler")
        self.product, self.clock, self.every_s, self.gpu, self.serving = product, clock, every_s, gpu, serving
        self.rss: list[tuple[float, dict[str, float]]] = []
        self.gpu_memory: list[tuple[float, dict[str, float]]] = []
        self.gpu_unread: str | None = None if gpu else "--device cpu: no GPU memory to read"
        self._lock = threading.Lock()

    def processes(self) -> tuple[dict[int, str], set[int]]:
        """pid -> series name of the processes sampled now, and the pids of the stubs skipped (a swap under way)."""
        found = {self.product.triton_pid: f"tritonserver pid {self.product.triton_pid}"} if self.product.triton_pid else {}
        version, stubs = self.serving(), self.product.stubs()
        if version is None:
            return found, {stub.pid for stub in stubs}
        return found | {stub.pid: f"stub {stub.instance} pid {stub.pid}{SERIES_VERSION}{version}" for stub in stubs}, set()

    def sample(self) -> None:
        with self._lock:
            t_s, (processes, skipped) = round(self.clock(), 2), self.processes()
            rss = {name: process_rss_bytes(pid) for pid, name in processes.items()}
            self.rss.append((t_s, {name: round(value / 2**20, 1) for name, value in rss.items() if value is not None}))
            if self.gpu:
                used, self.gpu_unread = stub_probes.gpu_memory_mib()
                if self.gpu_unread is None:  # a pid that is none of ours: another process, or one in another pid namespace
                    self.gpu_memory.append((t_s, {processes.get(pid, f"GPU process pid {pid} (not tritonserver or a text_embedding stub)"): float(mib)
                                                  for pid, mib in used.items() if pid not in skipped}))

    def work(self) -> None:
        self.sample()
        while not self.stopping.wait(self.every_s - self.clock() % self.every_s):
            self.sample()


class Load(Worker):
    """perf_analyzer at ``load``'s concurrency for the soak's periods, one run per period of ``period_s`` (it stops
    at a failed request, so it is started again: after one that ended on its own, or was cut (:meth:`cut`), for
    the rest of the period). A run whose requests are never answered (those inside a killed stub) does not end on
    SIGINT: it is killed after :data:`STOP_TIMEOUT_S`, its ``run_error`` says so."""

    def __init__(self, load: pa.Load, counter: RequestCounter, clock: Clock, period_s: float, periods: int) -> None:
        super().__init__("soak-load")
        self.load, self.counter, self.clock, self.period_s, self.periods = load, counter, clock, period_s, periods
        self.segments: list[Segment] = []
        self.analyzer = pa.find()
        self._cut = threading.Event()

    def cut(self) -> None:
        """End the current run now and start the next (after a killed stub's model serves again: the run's
        requests inside the dead stub would hold it until the period's end)."""
        self._cut.set()

    def work(self) -> None:
        for index in range(self.periods):
            end_s = (index + 1) * self.period_s
            while not self.stopping.is_set() and self.clock() < end_s - RESTART_PAUSE_S:
                segment = self.run_once(index, end_s)
                self.segments.append(segment)
                if segment.end_s < end_s:  # it ended early (a failed request, a cut, no start): not in a tight loop
                    self.stopping.wait(RESTART_PAUSE_S)
            if self.stopping.is_set():
                return

    def run_once(self, index: int, end_s: float) -> Segment:
        """One perf_analyzer run until ``end_s`` (or until it ends on its own, or the soak stops)."""
        start_s, (succeeded, failed) = self.clock(), self.counter.read()
        errors: list[str] = []
        run_error = None
        run = pa.TimedRun(self.analyzer, self.load, None)
        self._cut.clear()  # a cut is for the run under way when it came
        try:
            run.start()
            while self.clock() < end_s and not run.exited() and not self._cut.is_set() and not self.stopping.wait(0.2):
                pass
            errors = run.stop(timeout_s=STOP_TIMEOUT_S).errors
        except OSError as exc:  # it could not be started at all: this run is lost, the next one may start
            run_error = f"could not start perf_analyzer: {exc}"
        except pa.PerfAnalyzerError as exc:
            errors = list(exc.errors)
            if exc.unanswered:
                run_error = f"did not end within {STOP_TIMEOUT_S:g} s of SIGINT: requests it sent were never answered"
            elif not errors:
                run_error = " ".join(str(exc).split())[:300]
        finally:
            run.__exit__(None, None, None)  # kills it if it is still running
        after = self.counter.read()
        return Segment(index=index, start_s=round(start_s, 3), end_s=round(self.clock(), 3), succeeded=after[0] - succeeded,
                       failed=after[1] - failed, client_errors=tuple(errors), run_error=run_error)
