"""perf_analyzer, Triton's C++ load generator, for FastPath's served benchmarks: find it, write its input data,
run it, read its results.

perf_analyzer 2.51.0 ships inside the tritonclient 2.51.0 wheel; ``make setup`` (``make perf-analyzer``,
``scripts/install_perf_analyzer.sh``) puts it in ``.venv/bin`` and the two libraries it links,
``libcudart.so.12`` and ``libb64.so.0d``, in ``.venv/lib/perf_analyzer``. ``PERF_ANALYZER`` (the binary) and
``FASTPATH_PA_LIBS`` (its library folder) point elsewhere, e.g. on the GPU machine (``scripts/gpu_setup.sh``).

Two ways to run it:

* :func:`stable_cell`: perf_analyzer's own measurement, windows of ``measurement_ms`` until three agree
  within ``-s`` %; its CSV row (:func:`parse_csv`): throughput, client latency percentiles and the server's
  queue and compute times, all in microseconds.
* :class:`TimedRun`: load for as long as the caller wants (perf_analyzer's windows never count as stable,
  ``-s 0``; SIGINT ends the load), every request's send and response times and its outputs from
  ``--profile-export-file`` (:func:`parse_export`); a benchmark cuts its own windows from them
  (:func:`window`). For interleaved slices, actions during the load and latency by send time.

perf_analyzer stops a worker at its first failed request and ends the run at the next window's end (exit
99, no results): a run that returns results had no failed request. The failures it saw are in the
``Thread [i] had error: ...`` lines of its output (:func:`thread_errors`), one per worker that failed.
perf_analyzer 2.51 refuses ``--shared-memory`` for models with optional inputs (text_detection).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PROTOCOLS = ("grpc", "http")
# perf_analyzer's CSV columns (microseconds, but throughput) -> the names the benchmarks report
CSV_COLUMNS = {"Inferences/Second": "infer_per_s", "Client Send": "client_send_us", "Network+Server Send/Recv": "network_server_us",
               "Server Queue": "server_queue_us", "Server Compute Input": "server_compute_input_us",
               "Server Compute Infer": "server_compute_infer_us", "Server Compute Output": "server_compute_output_us",
               "Client Recv": "client_recv_us", "p50 latency": "p50_us", "p90 latency": "p90_us", "p95 latency": "p95_us",
               "p99 latency": "p99_us", "Avg latency": "avg_us"}
LOAD_STARTED = ("Request concurrency:", "Request Rate:")  # the line perf_analyzer prints as its load begins
TIMED_WINDOW_MS = 500  # a TimedRun's windows: a failed request or SIGINT ends the run within 1.2 of one
THREAD_ERROR = re.compile(r"^Thread \[(\d+)\] had error: (.*)$", re.M)


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer is missing, failed, or wrote no results; ``errors`` holds its failed requests' messages;
    ``unanswered`` is set when a :class:`TimedRun` did not end after SIGINT (requests it sent were never answered)."""

    def __init__(self, message: str, errors: list[str] | None = None, *, unanswered: bool = False) -> None:
        super().__init__(message)
        self.errors = errors or []
        self.unanswered = unanswered


@dataclass(frozen=True)
class PerfAnalyzer:
    """The binary and the folder of the libraries it links."""

    binary: Path
    library_dir: Path | None

    def env(self) -> dict[str, str]:
        """This process's environment with ``library_dir`` first on ``LD_LIBRARY_PATH``."""
        env = dict(os.environ)
        paths = [str(self.library_dir)] if self.library_dir else []
        env["LD_LIBRARY_PATH"] = ":".join(paths + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p])
        return env


def find() -> PerfAnalyzer:
    """perf_analyzer as ``make perf-analyzer`` installs it, or as ``PERF_ANALYZER``/``FASTPATH_PA_LIBS`` name it.

    Raises:
        PerfAnalyzerError: the binary or a library it needs is missing, naming it and how to install it.
    """
    venv = Path(sys.prefix)
    binary = Path(os.environ.get("PERF_ANALYZER") or (venv / "bin" / "perf_analyzer"))
    if not binary.exists():
        binary = Path(shutil.which("perf_analyzer") or binary)
    libraries = os.environ.get("FASTPATH_PA_LIBS") or str(venv / "lib" / "perf_analyzer")
    analyzer = PerfAnalyzer(binary, Path(libraries) if Path(libraries).is_dir() else None)
    if not binary.is_file():
        raise PerfAnalyzerError(f"perf_analyzer not found at {binary} (PERF_ANALYZER); it ships in the tritonclient 2.51.0 "
                                "wheel: run `make perf-analyzer`")
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=analyzer.env(), check=False)
    missing = sorted({line.split()[0] for line in done.stdout.splitlines() if "not found" in line})
    if missing:
        raise PerfAnalyzerError(f"perf_analyzer at {binary} lacks {', '.join(missing)} (looked in {libraries}, "
                                "FASTPATH_PA_LIBS): run `make perf-analyzer`")
    return analyzer


def missing_reason() -> str | None:
    """Why perf_analyzer cannot run here (the :class:`PerfAnalyzerError` of :func:`find`), or None."""
    try:
        find()
    except PerfAnalyzerError as exc:
        return str(exc)
    return None


# ---- input data (--input-data JSON) ----

def bytes_element(data: bytes) -> dict:
    """One BYTES element for the input JSON: ``{"b64": ...}`` of Triton's binary form, a 4-byte little-endian
    length and then the bytes (any bytes, also ones that are not UTF-8)."""
    return {"b64": base64.b64encode(struct.pack("<I", len(data)) + data).decode()}


def text_entries(texts: list[str], name: str = "TEXT") -> list[dict]:
    """One entry per text, tensor ``name`` of shape [1]. With ``-b N`` a request carries N consecutive entries."""
    return [{name: {"content": [text], "shape": [1]}} for text in texts]


def image_entries(images: list[bytes], name: str = "IMAGE_BYTES") -> list[dict]:
    """One entry per encoded image (JPEG, PNG, ... bytes), BYTES tensor ``name`` of shape [1]."""
    return [{name: {**bytes_element(data), "shape": [1]}} for data in images]


def array_entries(arrays: list, name: str) -> list[dict]:
    """One entry per numpy array, its raw bytes as ``b64`` and its shape (a fixed-dtype tensor such as uint8 IMAGE)."""
    return [{name: {"b64": base64.b64encode(array.tobytes()).decode(), "shape": list(array.shape)}} for array in arrays]


def write_input_data(path: Path, entries: list[dict]) -> Path:
    """Write ``{"data": entries}``, perf_analyzer's ``--input-data`` file; returns ``path``.

    Raises:
        ValueError: ``entries`` is empty.
    """
    if not entries:
        raise ValueError(f"input data for {path} has no entries; give at least one text or image")
    path.write_text(json.dumps({"data": entries}))
    return path


# ---- one load ----

@dataclass(frozen=True, kw_only=True)
class Load:
    """What perf_analyzer sends: ``model`` at ``url`` over ``protocol``, ``batch`` entries per request, either
    ``concurrency`` requests in flight (closed loop) or ``request_rate_per_s`` (open loop, constant spacing)."""

    model: str
    url: str
    data: Path
    protocol: str = "grpc"
    concurrency: int | None = None
    request_rate_per_s: float | None = None
    batch: int = 1
    extra_args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol {self.protocol!r} is not one of {PROTOCOLS}")
        if (self.concurrency is None) == (self.request_rate_per_s is None):
            raise ValueError(f"give concurrency or request_rate_per_s, not both or neither (got {self.concurrency}, "
                             f"{self.request_rate_per_s})")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency {self.concurrency} must be >= 1")
        if self.request_rate_per_s is not None and self.request_rate_per_s <= 0:
            raise ValueError(f"request_rate_per_s {self.request_rate_per_s} must be > 0")
        if self.batch < 1:
            raise ValueError(f"batch {self.batch} must be >= 1")

    def argv(self, analyzer: PerfAnalyzer) -> list[str]:
        """perf_analyzer's command line for this load, before the measurement options."""
        level = (["--concurrency-range", f"{self.concurrency}:{self.concurrency}"] if self.concurrency is not None
                 else ["--request-rate-range", f"{self.request_rate_per_s}:{self.request_rate_per_s}"])
        return [str(analyzer.binary), "-m", self.model, "-u", self.url, "-i", self.protocol, "--input-data", str(self.data),
                "-b", str(self.batch), *level, "--measurement-mode", "time_windows", *self.extra_args]


def thread_errors(output: str) -> list[str]:
    """The failed requests perf_analyzer reports: the message of each ``Thread [i] had error:`` line."""
    return [message.strip() for _, message in THREAD_ERROR.findall(output)]


def _failure(argv: list[str], returncode: int, output: str) -> PerfAnalyzerError:
    errors = thread_errors(output)
    what = f"{len(errors)} failed request(s): {errors[0]}" if errors else output.strip()[-1500:]
    return PerfAnalyzerError(f"perf_analyzer exited {returncode} ({' '.join(argv[1:7])} ...): {what}", errors)


# ---- perf_analyzer's own measurement: its CSV ----

def parse_csv(text: str, batch: int = 1) -> dict:
    """The first row of perf_analyzer's ``-f`` CSV (``--verbose-csv`` or not).

    Returns:
        The :data:`CSV_COLUMNS` present (latencies and server times in microseconds), plus ``req_per_s`` (its
        inferences/s over ``batch``), ``texts_per_s`` (inferences/s) and ``concurrency`` or ``request_rate_per_s``.

    Raises:
        PerfAnalyzerError: no data row, or no throughput column.
    """
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or "Inferences/Second" not in rows[0]:
        raise PerfAnalyzerError(f"perf_analyzer CSV has no row with Inferences/Second: {text[:300]!r}")
    row = rows[0]
    cell = {key: float(row[name]) for name, key in CSV_COLUMNS.items() if row.get(name) not in (None, "")}
    cell["texts_per_s"] = cell.pop("infer_per_s")
    cell["req_per_s"] = cell["texts_per_s"] / batch  # perf_analyzer counts inferences = batch x requests
    if "Concurrency" in row:
        cell["concurrency"] = int(row["Concurrency"])
    if "Request Rate" in row:
        cell["request_rate_per_s"] = float(row["Request Rate"])
    return cell


def stable_cell(analyzer: PerfAnalyzer, load: Load, *, measurement_ms: int, csv_path: Path, stability_pct: int = 25,
                max_trials: int = 6, timeout_s: float | None = None) -> dict:
    """One perf_analyzer measurement: windows of ``measurement_ms`` until three agree within ``stability_pct``;
    on a noisy machine one more try with windows twice as long and twice the tolerance.

    ``timeout_s`` bounds each try (None: 60 s of start-up and drain plus four times its ``max_trials`` windows,
    132 s for 3 s windows): a try past that is stuck (perf_analyzer waits for every request it sent), and a
    shorter bound leaves a device call's time to the cells after it.

    Returns:
        :func:`parse_csv` of its CSV, plus ``command`` and ``unstable_first_try``.

    Raises:
        PerfAnalyzerError: it failed (a failed request, no stable measurement on the second try, no server).
        subprocess.TimeoutExpired: it ran past ``timeout_s``.
    """
    argv = load.argv(analyzer) + ["-p", str(measurement_ms), "-s", str(stability_pct), "--max-trials", str(max_trials),
                                  "-f", str(csv_path), "--verbose-csv"]
    def bound(window_ms: int) -> float:
        return timeout_s if timeout_s is not None else 60 + 4 * max_trials * window_ms / 1000

    done = subprocess.run(argv, capture_output=True, text=True, env=analyzer.env(), timeout=bound(measurement_ms))
    unstable = "Failed to obtain stable measurement" in done.stdout + done.stderr
    if unstable:
        argv[argv.index("-p") + 1], argv[argv.index("-s") + 1] = str(2 * measurement_ms), str(2 * stability_pct)
        done = subprocess.run(argv, capture_output=True, text=True, env=analyzer.env(), timeout=bound(2 * measurement_ms))
    if done.returncode != 0 or not csv_path.exists():
        raise _failure(argv, done.returncode, done.stdout + done.stderr)
    cell = parse_csv(csv_path.read_text(), load.batch)
    cell["command"] = " ".join(argv)
    cell["unstable_first_try"] = unstable
    return cell


# ---- a load of the caller's length: every request from the profile export ----

@dataclass(frozen=True)
class Request:
    """One request of a profile export: send and last-response times (seconds, ``time.time()``'s clock) and
    the response's outputs (name -> value; tensors as nested lists)."""

    sent_s: float
    done_s: float
    outputs: dict

    @property
    def latency_s(self) -> float:
        return self.done_s - self.sent_s


@dataclass(frozen=True)
class RunResult:
    """A :class:`TimedRun`: its requests (sorted by send time; none without an export), the load's start and
    the SIGINT that ended it (``time.time()`` clock), the failed requests perf_analyzer reported, its output."""

    requests: list[Request]
    started_s: float
    ended_s: float
    errors: list[str]
    output: str


def parse_export(text: str) -> list[Request]:
    """Every answered request of a ``--profile-export-file`` JSON (perf_analyzer 2.51: ns since the epoch), sorted
    by send time. Raises PerfAnalyzerError when it has no experiment."""
    export = json.loads(text)
    if not export.get("experiments"):
        raise PerfAnalyzerError(f"perf_analyzer profile export has no experiment: {text[:300]!r}")
    requests = [Request(entry["timestamp"] / 1e9, entry["response_timestamps"][-1] / 1e9, (entry.get("response_outputs") or [{}])[-1])
                for experiment in export["experiments"] for entry in experiment["requests"] if entry["response_timestamps"]]
    return sorted(requests, key=lambda request: request.sent_s)


def window(requests: list[Request], start_s: float, end_s: float) -> dict:
    """The requests of ``[start_s, end_s]``: ``completed`` (answered inside it), ``throughput_per_s`` (those over
    its length) and ``latencies_s`` (of every request sent inside it, however late it finished: a slow request
    sent late counts, so p99 is not biased low)."""
    completed = sum(start_s <= request.done_s <= end_s for request in requests)
    latencies = [request.latency_s for request in requests if start_s <= request.sent_s <= end_s]
    return {"completed": completed, "throughput_per_s": completed / (end_s - start_s), "seconds": end_s - start_s,
            "latencies_s": latencies}


class TimedRun:
    """perf_analyzer loading ``load`` until :meth:`stop` (or the ``with`` block's end), recording every request.

    ``start()`` returns once the load has begun (``started_s``, ``time.time()`` clock). Its windows
    (:data:`TIMED_WINDOW_MS`) never count as stable (``-s 0``), so it loads until SIGINT; it then waits for the
    requests in flight and writes ``export_path``, all within about one window. Without ``export_path`` it
    records nothing per request (writing every response's outputs costs perf_analyzer CPU): for a benchmark
    that counts requests elsewhere, e.g. in Triton's statistics.
    """

    def __init__(self, analyzer: PerfAnalyzer, load: Load, export_path: Path | None, *, start_timeout_s: float = 60) -> None:
        self.analyzer, self.load, self.export_path = analyzer, load, export_path
        self.start_timeout_s = start_timeout_s
        self.argv = load.argv(analyzer) + ["-p", str(TIMED_WINDOW_MS), "-s", "0", "--max-trials", "1000000"]
        if export_path is not None:
            self.argv += ["--profile-export-file", str(export_path)]
        self.started_s = float("nan")
        self._process: subprocess.Popen | None = None
        self._head = b""

    def start(self) -> TimedRun:
        """Start perf_analyzer; return once it prints that its load began.

        Raises:
            PerfAnalyzerError: it exited or printed nothing of the sort within ``start_timeout_s``.
        """
        if self.export_path is not None:
            self.export_path.unlink(missing_ok=True)
        self._process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.analyzer.env())
        deadline = time.monotonic() + self.start_timeout_s
        descriptor = self._process.stdout.fileno()
        with selectors.DefaultSelector() as selector:  # raw reads: a buffered readline could hold the line back
            selector.register(descriptor, selectors.EVENT_READ)
            while time.monotonic() < deadline and selector.select(timeout=deadline - time.monotonic()):
                chunk = os.read(descriptor, 65536)
                self._head += chunk
                if any(line.startswith(LOAD_STARTED) for line in self._head.decode(errors="replace").splitlines()):
                    self.started_s = time.time()
                    return self
                if not chunk:  # it exited before its load began
                    break
        process, self._process = self._process, None  # reaped here: stop() and __exit__ have nothing left to end
        process.kill()
        rest = process.communicate()[0]
        raise _failure(self.argv, process.returncode, (self._head + rest).decode(errors="replace"))

    def exited(self) -> bool:
        """Whether perf_analyzer has ended on its own since :meth:`start` (a failed request ends the run at the
        next window's end); :meth:`stop` then raises with its errors."""
        return self._process is not None and self._process.poll() is not None

    def stop(self, timeout_s: float = 60) -> RunResult:
        """End the load (SIGINT), wait for perf_analyzer, read its export.

        Raises:
            PerfAnalyzerError: it failed without an export (a failed request ends it at a window's end: the
                errors are on the exception), exited before ``stop``, or did not end within ``timeout_s``
                (``unanswered``: it waits for every request it sent; it is killed).
        """
        process = self._process
        if process is None:
            raise PerfAnalyzerError("TimedRun.stop() before start()")
        early = process.poll() is not None
        ended_s = time.time()
        if not early:
            process.send_signal(signal.SIGINT)
        try:
            output = (self._head + process.communicate(timeout=timeout_s)[0]).decode(errors="replace")
        except subprocess.TimeoutExpired:
            process.kill()
            output = (self._head + process.communicate()[0]).decode(errors="replace")
            raise PerfAnalyzerError(f"perf_analyzer did not end within {timeout_s} s of SIGINT (requests it sent were not "
                                    f"answered): {output[-800:]}", thread_errors(output), unanswered=True) from None
        finally:
            self._process = None
        if early or process.returncode != 0 or (self.export_path is not None and not self.export_path.exists()):
            raise _failure(self.argv, process.returncode, output)
        requests = parse_export(self.export_path.read_text()) if self.export_path is not None else []
        return RunResult(requests, self.started_s, ended_s, thread_errors(output), output)

    def __enter__(self) -> TimedRun:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:  # the block raised before stop(): do not leave perf_analyzer loading
            self._process.kill()
            self._process.communicate()
            self._process = None


def timed(analyzer: PerfAnalyzer, load: Load, seconds: float, export_path: Path | None) -> RunResult:
    """:class:`TimedRun` for ``seconds`` of load."""
    run = TimedRun(analyzer, load, export_path).start()
    try:
        time.sleep(max(0.0, run.started_s + seconds - time.time()))
        return run.stop()
    finally:
        run.__exit__(None, None, None)
