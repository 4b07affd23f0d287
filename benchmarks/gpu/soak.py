"""A soak of the product as shipped: ``python -m fastpath serve`` under steady load for ``--duration-s`` while text_embedding
is swapped live between versions 1 and 2 every period, reloaded twice through Triton's repository API and has one of its
stubs killed; then the spec's goals: no failed request outside the killed stub's window, every process's memory flat
within 5 % after warm-up, every response's ``MODEL_VERSION`` the serving one.

The server is ``fastpath serve --device DEVICE --model text_embedding --model fastpath_admin`` (benchmarks/gpu/soak_parts.py).
On the GPU version 1 is torch fp16 and version 2 torch bf16 (``configs/gpu.pbtxt``); on the CPU, ONNX fp32 and INT8.
  load     perf_analyzer at ``--concurrency`` (one pydoc sentence per request, no profile export), one run per period,
           started again when it stops at a failed request; requests counted from Triton's statistics.
  actions  per period of ``--period-s``: a swap to the other version a third in (``fastpath_admin``, the admin key
           ``fastpath serve`` generated); two thirds into the periods at 1/4 and 3/4 of the run a reload with a config
           override (``cancel_check_after_us`` one microsecond more: Triton 2.51 ignores a load whose override equals
           the loaded config) that must keep the serving version (docs/design/hot-swap.md), and at 1/2 a SIGKILL of one
           stub, which ``fastpath serve``'s stub supervisor must recover (the action returns once it serves again).
  probe    one thread, gRPC, ``--probe-rate-per-s`` one-text requests, each response's ``MODEL_VERSION`` and times.
  memory   every ``--sample-every-s``: RSS of tritonserver and each text_embedding stub, GPU memory per process.

    python benchmarks/gpu/soak.py --device cuda                       # the GPU run (benchmarks/gpu/soak_gpu.sh)
    .venv/bin/python benchmarks/gpu/soak.py --device cpu --duration-s 150 --period-s 15 --sample-every-s 10 \\
        --warmup-s 20 --out /tmp/soak_cpu.json                        # a dry run on a CPU machine
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import soak_checks as checks  # noqa: E402
import soak_parts as parts  # noqa: E402
import soak_report as report  # noqa: E402
from soak_parts import MODEL, SoakError  # noqa: E402

pa = parts.pa
SPECIAL_ACTIONS = ((0.25, "reload"), (0.5, "kill"), (0.75, "reload"))  # (fraction of the run, kind)


def plan(duration_s: float, period_s: float) -> list[tuple[float, str]]:
    """(when, kind) of every action: a swap a third into each period, the :data:`SPECIAL_ACTIONS` two thirds into theirs."""
    periods = int(duration_s // period_s)
    actions = [(k * period_s + period_s / 3, "swap") for k in range(periods)]
    actions += [(min(periods - 1, round(periods * share)) * period_s + 2 * period_s / 3, kind) for share, kind in SPECIAL_ACTIONS]
    return sorted(actions)


class Soak:
    """The served product, its background parts and the actions' record."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir, self.clock = args, workdir, parts.Clock()
        self.product = parts.ServedProduct(args.device, workdir, args.ready_timeout_s)
        self.counter = self.probe = self.sampler = self.load = None
        self.actions: list[checks.Action] = []
        self.plan = plan(args.duration_s, args.period_s)
        self.version = self.initial_version = None
        self.acting: str | None = None  # the action under way
        self.admin = None

    def status_version(self) -> int | None:
        """The serving version ``status`` reports (None when it fails, or the instances disagree)."""
        from tritonclient.utils import InferenceServerException

        try:
            return self.admin.status()["active_version"]
        except InferenceServerException as exc:
            self.log(f"status failed: {exc}")
            return None

    def log(self, line: str) -> None:
        print(f"[{self.clock():7.1f} s] {line}", flush=True)

    def start(self, texts: list[str], data: Path) -> None:
        self.product.start()
        self.clock.start()
        self.admin = parts.Admin(self.product.grpc_url, self.product.admin_key)
        self.version = self.initial_version = self.status_version()
        self.log(f"ready: {self.product.described()} (tritonserver pid {self.product.triton_pid}, "
                 f"{len(self.product.stubs())} text_embedding stubs, serving version {self.version})")
        self.counter = parts.RequestCounter(self.product.grpc_url)
        self.probe = parts.Probe(self.product.grpc_url, texts, self.args.probe_rate_per_s, self.clock)
        self.sampler = parts.Sampler(self.product, self.clock, self.args.sample_every_s, gpu=self.args.device == "cuda",
                                     serving=lambda: None if self.acting == "swap" else self.version)
        load = pa.Load(model=MODEL, url=self.product.grpc_url, protocol="grpc", data=data, concurrency=self.args.concurrency)
        self.load = parts.Load(load, self.counter, self.clock, self.args.period_s, int(self.args.duration_s // self.args.period_s))
        for worker in self.workers():
            worker.start()

    def workers(self) -> list[parts.Worker]:
        """The background parts started so far, in start order."""
        return [w for w in (self.counter, self.probe, self.sampler, self.load) if w is not None]

    def run(self) -> None:
        from soak_actions import ACTIONS

        for when_s, kind in self.plan:
            time.sleep(max(0.0, when_s - self.clock()))
            self.acting = kind
            try:
                action = ACTIONS[kind](self)
                self.actions.append(action)
                if action.version_after is not None:
                    self.version = action.version_after  # before the sampler may label a stub's memory again
            finally:
                self.acting = None
            self.log(f"{kind} {'ok' if action.ok else 'FAILED'} in {action.return_s - action.call_s:.2f} s, version "
                     f"{action.version_before} -> {action.version_after}: {action.detail}")
            self.progress()
        while self.load.is_alive() and self.clock() < self.args.duration_s + 120:
            self.load.join(self.args.period_s)
            self.progress()
        self.sampler.sample()

    def progress(self) -> None:
        """One line: load runs, requests and failures so far, probe responses."""
        succeeded, failed = self.counter.read()
        probe_failed = sum(r.error is not None for r in self.probe.responses)
        self.log(f"progress: {len(self.load.segments)} load runs, Triton counted {succeeded} answered and {failed} failed "
                 f"requests; probe {len(self.probe.responses)} sent, {probe_failed} failed")

    def stop(self) -> int | None:
        """Stop every part (perf_analyzer first), then the server; never leaves either running."""
        for worker in reversed(self.workers()):
            worker.stop()
        return self.product.stop()


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--period-s", type=float, default=30.0, help="one swap and one perf_analyzer run per period")
    parser.add_argument("--sample-every-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=60.0, help="a process's memory baseline: its first sample this long after it appeared")
    parser.add_argument("--concurrency", type=int, help="perf_analyzer's requests in flight (default 256 on cuda, 16 on cpu)")
    parser.add_argument("--probe-rate-per-s", type=float, default=20.0)
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    parser.add_argument("--recovery-timeout-s", type=float, default=300.0, help="for the killed stub's model to serve again")
    parser.add_argument("--workdir", type=Path, help="serve.log, probe.csv and soak.pid (default: a new temporary directory)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/soak_gpu.json"),
                        help="the JSON; with --device cuda also a Markdown page beside it")
    args = parser.parse_args(argv)
    args.concurrency = args.concurrency or (256 if args.device == "cuda" else 16)
    if args.device == "cpu" and "docs/benchmarks" in str(args.out.resolve()):
        parser.error(f"--out {args.out}: a --device cpu run is a dry run, not a benchmark result; give --out outside "
                     "docs/benchmarks, e.g. /tmp/soak_cpu.json")
    if args.duration_s < 4 * args.period_s:
        parser.error(f"--duration-s {args.duration_s:g} must hold at least 4 periods of --period-s {args.period_s:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from fastpath.text.corpus import pydoc_sentences

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "soak.pid").write_text(f"{os.getpid()}\n")  # for benchmarks/gpu/soak_gpu.sh stop: SIGTERM ends it cleanly
    try:
        pa.find()
    except pa.PerfAnalyzerError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    texts = pydoc_sentences()
    data = pa.write_input_data(workdir / "texts.json", pa.text_entries(texts))
    for signum in (signal.SIGINT, signal.SIGTERM):  # also where SIGINT came ignored (a background job)
        signal.signal(signum, _interrupt)
    soak, interrupted = Soak(args, workdir), None
    load_average = os.getloadavg()
    try:
        soak.start(texts, data)
        soak.run()
    except SoakError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        interrupted = str(exc) or "SIGINT"
        soak.log(f"interrupted ({interrupted}): stopping the load and the server")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        serve_code = soak.stop()
    result = report.build(soak, args, interrupted=interrupted, serve_exit_code=serve_code,
                          machine=report.machine(args.device, load_average[0]))
    report.write(result, soak, args, workdir)
    return 0 if all(goal["met"] for goal in result["goals"].values() if goal["met"] is not None) and not interrupted else 1


if __name__ == "__main__":
    raise SystemExit(main())
