"""CPU benchmark of FastPath's batch scheduler against raw engine runs and two served baselines.

Run from the repository root with the artifacts built (about 8 minutes on a 2-core machine):

    .venv/bin/python benchmarks/scheduler_cpu.py

Side by side in one run, on real sentences (``fastpath.text.corpus.pydoc_sentences``, shuffled with a
fixed seed), one text per request, at concurrency 1, 8 and 32:

    raw_ideal         raw engine: batches of 64 texts of nearly equal length (runs of the length-sorted
                      corpus at evenly spaced quantiles), each padded to its longest: no padding waste
    raw_arrival_64    raw engine: batches of 64 in arrival order, padded to the longest
    raw_batch_1       raw engine: one text per engine call, back to back
    raw_call          raw engine: one text per engine call, each after an idle gap of the round's echo
                      p50 (concurrency 1): "a single raw engine call" of the latency goal
    naive             served: python backend, one engine call per request (benchmarks/models)
    stack_pad         served: Triton dynamic batcher + stack and pad to the longest (benchmarks/models)
    fastpath          served: model_repository/text_embedding as shipped (FastPath's scheduler,
                      two engine lanes on two cores, inline execute when idle)
    echo              served, no engine (concurrency 1): Triton's own per-request overhead

Before and after a change, in one run: ``--ref GIT_REF`` adds ``fastpath_ref``, the shipped
text_embedding served by the FastPath package as it was at ``GIT_REF`` (its backend tree and config.pbtxt,
extracted with ``git archive``; its stubs import that tree), reported as ``fastpath_vs_fastpath_ref``.

More FastPath variants for A/B runs (``--variants``): see scheduler_repository.FASTPATH_VARIANTS, e.g. ``fastpath_1lane``
(concurrent_batches=1: one batch at a time on one ONNX Runtime session of every thread, no engine
lanes), ``fastpath_return_2x1`` (return mode on two instances of one ONNX Runtime
thread each, the throughput configuration of docs/deployment.md), ``fastpath_return``
(response_mode=return: execute() runs the batches of every request queued meanwhile and returns
their responses).

The machine is shared and small, and its speed drifts during a run even with no other process
busy (each slice records the CPU other processes took: benchmarks/cpu_meter.py). Every concurrency
is measured in ``--rounds`` rounds; a round makes ``--passes`` passes over the served variants (at
concurrency 1 with echo, after raw_batch_1 and before raw_call), alternating their order, and puts a
raw_ideal run before and after every slice: ideal, v1, ideal, v2, ideal, ... (``interleaved_round``).
A cell (a variant's slices in one round) measures ``--warmup-s`` + ``--duration-s / --passes``
per slice; its ``vs ideal`` is its throughput over the mean of the raw_ideal runs beside its slices,
a ratio between two served variants the ratio of their ``vs ideal``; the median over rounds is
reported. Writes docs/benchmarks/scheduler_cpu.json and .md (``--out`` changes the stem).

The served load is perf_analyzer 2.51 (Triton's C++ load generator, ``make perf-analyzer``;
benchmarks/perf_analyzer.py): one run per slice over gRPC, ``concurrency`` synchronous workers each
keeping one request in flight, the texts in the slice's order as its ``--input-data``. Each slice's
window is cut from the run's profile export (every request's send and response time), so warm-up,
window and latency by send time are as this benchmark defines them, not perf_analyzer's own stable
windows. perf_analyzer stops at a failed request, and so does the benchmark, naming the error: the
``errors`` column of a finished run is 0. The raw engine runs, the metrics scrape and the served INT8
cosine use tritonclient: they are single calls, not load.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

import perf_analyzer as pa  # noqa: E402
from cpu_meter import CpuMeter  # noqa: E402
from scheduler_report import goals, markdown, summarize  # noqa: E402
from scheduler_repository import ARTIFACTS, SERVED, build_repository  # noqa: E402

DEFAULT_VARIANTS = ("naive", "stack_pad", "fastpath")

RAW_TEXTS = {"raw_ideal": 256, "raw_arrival_64": 128, "raw_batch_1": 96}  # texts per raw measurement


class RawEngine:
    """The raw engine loops, run inside a python-backend stub (benchmarks/models raw_engine_bench).

    Same tokenizer, ONNX artifact and ONNX Runtime settings as the served models. Measured here: on
    this shared machine the same engine call ran ~1.7x slower in the benchmark's own process than
    inside a stub at the same moment, so raw and served variants both run in stubs.

    Throughputs are normalized by tokens: real tokens per second / ``mean_tokens`` (the corpus'
    mean tokens per text), so samples of different length mixes compare fairly.
    """

    def __init__(self, server, texts: list[str], mean_tokens: float) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.grpc = grpcclient
        self.mean_tokens = mean_tokens
        self.meter = CpuMeter()

    def measure(self, mode: str, texts: list[str], gap_us: int = 0) -> dict:
        start = self.meter.sample()
        data = np.array([text.encode() for text in texts], dtype=np.object_)
        tensor = self.grpc.InferInput("TEXT", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(data)
        result = self.client.infer("raw_engine_bench", [tensor], parameters={"mode": mode, "gap_us": gap_us}, client_timeout=600)
        elapsed, padded, real = result.as_numpy("STATS").tolist()
        calls = result.as_numpy("CALL_S").tolist() if mode in ("raw_batch_1", "raw_call") else []
        return {"throughput_per_s": real / elapsed / self.mean_tokens, "padded_tokens": padded, "real_tokens": real,
                "latencies_s": calls, "texts": len(texts), "cpu": self.meter.since(start)}


def merge_raw(runs: list[dict]) -> dict:
    """One raw cell from several runs: mean throughput, summed tokens and latencies, the busiest run's CPU."""
    return {"throughput_per_s": sum(run["throughput_per_s"] for run in runs) / len(runs),
            "cpu": max((run["cpu"] for run in runs), key=lambda cpu: cpu["other_cores"]),
            "padded_tokens": sum(run["padded_tokens"] for run in runs),
            "real_tokens": sum(run["real_tokens"] for run in runs),
            "latencies_s": [value for run in runs for value in run["latencies_s"]]}


IDEAL_SETTLE_S = 0.5  # pause before each raw_ideal run, so a served slice's tail (lingering threads) is over


def interleaved_round(raw: RawEngine, slice_load: Callable[[str], dict], metrics_url: str, variants: list[str],
                      ideal: Callable[[], dict], args, index: int, before: Callable[[], dict] | None = None,
                      after: Callable[[dict], dict] | None = None) -> dict:
    """One round: ``args.passes`` passes over the served ``variants`` (order reversed every other pass and
    round), each slice (``slice_load(model)``: :func:`load_slice`, ``args.warmup_s`` + ``args.duration_s /
    args.passes`` measured) between two ``ideal`` runs: ideal, v1, ideal, v2, ideal, ..., over every pass.

    Returns {variant: cell (:func:`merge_slices`, with the round's padded and real tokens from the
    metrics endpoint)} plus "raw_ideal" (all its runs merged) and, where given, "before" (``before()``:
    a raw cell measured after the first ideal run) and "after" (``after(cells)``: measured last).

    Why slices: the dev machine's speed drifts on a scale of seconds with no other process busy
    (the raw ideal can move from 183 to 297 texts/s between rounds, and 247-331 back to back), so a yardstick measured away from a cell is off by as much as the
    differences measured. A cell of one 5 s block between two raw_ideal runs, with the faster as its
    yardstick, would not do: the maximum of two draws of that spread sits above the machine's typical
    speed during the cell, and the argument for it ("interference only slows the
    raw engine") does not hold for the drift, which slows served and raw alike. Alternating short slices
    puts every variant and the raw engine in the same window, and the mean of many runs estimates the
    raw engine's speed over it.
    """
    def settled() -> dict:
        time.sleep(IDEAL_SETTLE_S)
        return ideal()

    start_counts = scrape_counters(metrics_url)
    runs = [settled()]
    cells: dict = {}

    def bracket(name: str, measure: Callable[[], dict]) -> None:
        cells[name] = measure()
        runs.append(settled())
        cells[name]["ideal_runs_per_s"] = [runs[-2]["throughput_per_s"], runs[-1]["throughput_per_s"]]
        cells[name]["ideal_per_s"] = statistics.fmean(cells[name]["ideal_runs_per_s"])

    if before is not None:
        bracket("before", before)
    slices: dict[str, list[dict]] = {variant: [] for variant in variants}
    for number in range(args.passes):
        for variant in (variants if (index + number) % 2 == 0 else variants[::-1]):
            start = raw.meter.sample()
            cell = slice_load(SERVED[variant])
            cell["cpu"] = raw.meter.since(start)
            runs.append(settled())
            cell["ideal_runs_per_s"] = [runs[-2]["throughput_per_s"], runs[-1]["throughput_per_s"]]
            slices[variant].append(cell)
    cells.update({variant: merge_slices(parts) for variant, parts in slices.items()})
    if after is not None:
        bracket("after", lambda: after(cells))
    end_counts = scrape_counters(metrics_url)
    for variant in variants:
        model = SERVED[variant]
        for kind, field in (("padded", "padded_tokens"), ("real", "real_tokens"), ("calls", "engine_calls"),
                            ("texts", "engine_texts")):
            key = f"{model}:{kind}"
            cells[variant][field] = end_counts.get(key, 0.0) - start_counts.get(key, 0.0)
    return {"raw_ideal": merge_raw(runs), **cells}


SCRAPED = {"fastpath_padded_tokens_total": "padded", "fastpath_real_tokens_total": "real",
           "bench_padded_tokens_total": "padded", "bench_real_tokens_total": "real",
           "fastpath_batch_size_count": "calls", "fastpath_batch_size_sum": "texts"}


def scrape_counters(metrics_url: str) -> dict[str, float]:
    """Padded and real token counters per model, and FastPath's engine calls and the texts they ran,
    from the metrics endpoint: {"model:padded": n, "model:real": n, "model:calls": n, "model:texts": n}."""
    time.sleep(0.6)  # FastPath publishes its metrics every metrics_interval_ms (500 ms)
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        kind = SCRAPED.get(line.split("{", 1)[0])
        if kind is not None:
            model = line.split('model="', 1)[1].split('"', 1)[0]
            key = f"{model}:{kind}"
            values[key] = values.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def load_slice(analyzer: pa.PerfAnalyzer, url: str, model: str, texts: list[str], concurrency: int, warmup_s: float,
               duration_s: float, cursor: list[int], workdir: Path) -> dict:
    """One closed-loop slice from perf_analyzer over gRPC: ``concurrency`` requests in flight, one text per
    request (``texts`` from ``cursor[0]`` on, which advances by the requests sent), loading for ``warmup_s`` +
    ``duration_s``; the window [load start + ``warmup_s``, + ``duration_s``] is cut from its profile export
    (:class:`perf_analyzer.TimedRun`), and the requests in flight at its end are waited for.

    Returns {"throughput_per_s": completions inside the window / ``duration_s``, "texts": those completions,
    "seconds": ``duration_s``, "latencies_s": the latency of every request sent inside the window, "errors": 0}.
    Latencies are taken by send time, so a slow request sent late in the window counts (taking only those
    that also finished inside it would cut off the longest ones and bias p99 low).

    Raises:
        perf_analyzer.PerfAnalyzerError: a request failed (perf_analyzer stops at the first), naming the error.
    """
    first = cursor[0] % len(texts)
    data = pa.write_input_data(workdir / "slice_input.json", pa.text_entries(texts[first:] + texts[:first]))
    load = pa.Load(model=model, url=url, data=data, concurrency=concurrency)
    result = pa.timed(analyzer, load, warmup_s + duration_s, workdir / "slice_export.json")
    if result.errors:
        raise pa.PerfAnalyzerError(f"{model}: {len(result.errors)} failed request(s): {result.errors[0]}", result.errors)
    cursor[0] += len(result.requests)
    begin = result.started_s + warmup_s
    window = pa.window(result.requests, begin, begin + duration_s)
    return {"throughput_per_s": window["throughput_per_s"], "texts": window["completed"], "seconds": duration_s,
            "latencies_s": window["latencies_s"], "errors": 0}


def load(url: str, model: str, texts: list[str], concurrency: int, warmup_s: float, duration_s: float) -> dict:
    """:func:`load_slice` on its own, starting at a random text."""
    with tempfile.TemporaryDirectory(prefix="fastpath-load-") as tmp:
        return load_slice(pa.find(), url, model, texts, concurrency, warmup_s, duration_s, [random.randrange(len(texts))], Path(tmp))


def merge_slices(slices: list[dict]) -> dict:
    """One served cell from its equally long slices, each carrying ``ideal_runs_per_s`` (the raw_ideal
    runs just before and after it) and ``cpu``.

    ``throughput_per_s``: completions over measured seconds, all slices. ``ideal_per_s``, the cell's
    yardstick: the mean over its slices of the mean of the two runs beside each. ``ideal_strict_per_s``:
    the same with the faster of the two, a stricter yardstick, kept for comparison. ``slice_vs_ideal``: each slice's throughput over the mean of its two runs (the spread).
    """
    seconds = sum(cell["seconds"] for cell in slices)
    pairs = [cell["ideal_runs_per_s"] for cell in slices]
    return {
        "throughput_per_s": sum(cell["texts"] for cell in slices) / seconds,
        "texts": sum(cell["texts"] for cell in slices), "seconds": seconds,
        "latencies_s": [value for cell in slices for value in cell["latencies_s"]],
        "errors": sum(cell["errors"] for cell in slices),
        "cpu": max((cell["cpu"] for cell in slices), key=lambda cpu: cpu["other_cores"]),
        "ideal_runs_per_s": [value for pair in pairs for value in pair],
        "ideal_per_s": statistics.fmean(statistics.fmean(pair) for pair in pairs),
        "ideal_strict_per_s": statistics.fmean(max(pair) for pair in pairs),
        "slice_vs_ideal": [round(cell["throughput_per_s"] / statistics.fmean(pair), 3) for cell, pair in zip(slices, pairs)],
    }


def served_cosine(server, reference: str, candidate: str, texts: list[str]) -> dict:
    """Cosine of ``candidate``'s served embeddings to ``reference``'s on ``texts`` (gRPC, 64 texts per request)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    outputs: dict[str, list[np.ndarray]] = {reference: [], candidate: []}
    for start in range(0, len(texts), 64):
        chunk = texts[start : start + 64]
        tensor = grpcclient.InferInput("TEXT", [len(chunk), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in chunk], dtype=np.object_))
        for model in outputs:
            outputs[model].append(client.infer(model, [tensor]).as_numpy("EMBEDDING"))
    a, b = (np.concatenate(outputs[m]) for m in (reference, candidate))
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"texts": len(texts), "min": round(float(cosine.min()), 5), "mean": round(float(cosine.mean()), 5)}


def ideal_sample(sorted_texts: list[str], round_index: int, runs: int = 4) -> list[str]:
    """``runs`` runs of 64 consecutive texts of the length-sorted corpus at evenly spaced quantiles:
    batches of 64 of nearly equal length (no padding waste), spread over the whole length mix."""
    sample: list[str] = []
    for k in range(runs):
        start = int((k + 0.5) / runs * (len(sorted_texts) - 64)) + (round_index * 17) % 64 - 32
        start = min(max(start, 0), len(sorted_texts) - 64)
        sample += sorted_texts[start : start + 64]
    return sample


def run_round(raw: RawEngine, server, metrics_url: str, texts: list[str], sorted_texts: list[str],
              sample: Callable[[int], list[str]], concurrency: int, index: int, args) -> dict:
    """One round at ``concurrency`` (:func:`interleaved_round`, slices of :func:`load_slice`); at concurrency 1
    also echo among the served variants, raw_batch_1 first and raw_call last (one raw call after the idle gap
    of the round's echo p50)."""
    variants = list(args.variants) + (["echo"] if concurrency == 1 else [])
    ideal_samples = itertools.count(index * 64)
    cursor = [random.randrange(len(texts))]

    def ideal() -> dict:
        return raw.measure("raw_ideal", ideal_sample(sorted_texts, next(ideal_samples)))

    before = after = None
    if concurrency == 1:
        def before() -> dict:
            return raw.measure("raw_batch_1", sample(RAW_TEXTS["raw_batch_1"]))

        def after(cells: dict) -> dict:
            gap_us = int(np.percentile(cells["echo"]["latencies_s"], 50) * 1e6)
            return raw.measure("raw_call", sample(RAW_TEXTS["raw_batch_1"]), gap_us=gap_us)

    analyzer = pa.find()
    with tempfile.TemporaryDirectory(prefix="fastpath-slices-") as tmp:
        def slice_load(model: str) -> dict:
            return load_slice(analyzer, server.grpc_url, model, texts, concurrency, args.warmup_s, args.duration_s / args.passes,
                              cursor, Path(tmp))

        cells = interleaved_round(raw, slice_load, metrics_url, variants, ideal, args, index, before, after)
    for name, renamed in (("before", "raw_batch_1"), ("after", "raw_call")):
        if name in cells:
            cells[renamed] = cells.pop(name)
    return cells


def workload_texts() -> list[str]:
    """The benchmarks' workload: ``fastpath.text.corpus.pydoc_sentences()`` shuffled with seed 0."""
    from fastpath.text.corpus import pydoc_sentences

    texts = pydoc_sentences()
    random.Random(0).shuffle(texts)
    return texts


def by_length(texts: list[str]) -> tuple[list[int], list[str]]:
    """Each text's token count (the served tokenizer, 256 tokens at most) and the texts sorted by it
    (what :func:`ideal_sample` draws equal-length batches from)."""
    from fastpath.text import TextTokenizer

    tokenizer = TextTokenizer(ARTIFACTS / "tokenizer.json", max_seq_length=256)
    lengths = [len(e.ids) for e in tokenizer.encode(texts)]
    return lengths, [text for _, text in sorted(zip(lengths, texts), key=lambda pair: pair[0])]


def run_rounds(texts: list[str], args) -> dict:
    """{concurrency: [round, ...]}, each round {variant: cell}; plus the raw-only rounds under key "raw"."""
    from conftest import start_server

    lengths, sorted_texts = by_length(texts)
    cursor = [0]

    def sample(count: int) -> list[str]:
        start, cursor[0] = cursor[0], cursor[0] + count
        return [texts[(start + k) % len(texts)] for k in range(count)]

    rounds: dict = {"raw": [], "mean_tokens": sum(lengths) / len(lengths)}
    with tempfile.TemporaryDirectory(prefix="fastpath-bench-") as tmp:
        # Only the models this run measures: each loaded FastPath model has background threads (its swap
        # agent, metrics flusher, stub watchdog): all 17 loaded at once, their 5 ms control-plane polling
        # takes 0.17 of the 2 cores while idle.
        models = tuple(dict.fromkeys([SERVED[v] for v in args.variants] + ["echo_embedding", "raw_engine_bench"]))
        server = start_server(Path(tmp), models=models, repository=build_repository(Path(tmp), args.ref))
        metrics_url = f"http://127.0.0.1:{server.options.metrics_port}/metrics"
        raw = RawEngine(server, texts, rounds["mean_tokens"])
        try:
            raw.measure("raw_ideal", ideal_sample(sorted_texts, 0))  # warm-up
            for index in range(args.rounds):
                rounds["raw"].append({"raw_ideal": raw.measure("raw_ideal", ideal_sample(sorted_texts, index)),
                                      **{name: raw.measure(name, sample(count)) for name, count in RAW_TEXTS.items()
                                         if name != "raw_ideal"}})
            for concurrency in args.concurrency:
                rounds[str(concurrency)] = []
                for index in range(args.rounds):
                    cells = run_round(raw, server, metrics_url, texts, sorted_texts, sample, concurrency, index, args)
                    rounds[str(concurrency)].append(cells)
                    print(f"c={concurrency:<3d} round {index}: " + "  ".join(
                        f"{name} {cell['throughput_per_s']:.1f}/s" for name, cell in cells.items())
                        + f"  (other processes: up to {max(c['cpu']['other_cores'] for c in cells.values()):.2f} cores)",
                        flush=True)
            if "fastpath_int8" in args.variants:
                rounds["int8_served_cosine"] = served_cosine(server, SERVED["fastpath"], SERVED["fastpath_int8"], texts[:512])
                print("served INT8 vs FP32 cosine:", rounds["int8_served_cosine"], flush=True)
        finally:
            server.stop()
            log = (Path(tmp) / "tritonserver.log").read_text(errors="replace")
            if "Traceback" in log:
                print(log[-4000:])
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=sorted(set(SERVED) - {"echo"}),
                        help="served variants per round (the goals need naive, stack_pad and fastpath)")
    parser.add_argument("--passes", type=int, default=3, help="slices per variant per round")
    parser.add_argument("--ref", help="also serve text_embedding from the FastPath package at this git ref "
                        "(variant fastpath_ref): before and after a change, in one run")
    parser.add_argument("--warmup-s", type=float, default=0.5, help="warm-up before each slice's window")
    parser.add_argument("--duration-s", type=float, default=6.0, help="measured seconds per variant per round, "
                        "split over its --passes slices")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "scheduler_cpu")
    parser.add_argument("--nice", type=int, default=0,
                        help="add to this process's nice value (inherited by tritonserver and its stubs); a "
                             "negative value (root only) shields the measurement from other CPU-bound jobs")
    parser.add_argument("--machine-note", default="2-core dev machine, shared; its speed drifts, so compare ratios within a round",
                        help="what the report says of the machine")
    args = parser.parse_args(argv)
    if args.ref is not None and "fastpath_ref" not in args.variants:
        args.variants.append("fastpath_ref")
    if args.ref is None and "fastpath_ref" in args.variants:
        parser.error("variant fastpath_ref needs --ref GIT_REF")
    if args.nice:
        os.nice(args.nice)

    texts = workload_texts()
    random.seed(1)
    started = time.time()
    load_before = os.getloadavg()
    rounds = run_rounds(texts, args)
    report = {
        "command": " ".join([".venv/bin/python benchmarks/scheduler_cpu.py"] + (argv if argv is not None else sys.argv[1:])),
        "machine": {"cpus": os.cpu_count(), "process_cpus": len(os.sched_getaffinity(0)),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "nice": os.nice(0),
                    "note": args.machine_note},
        "workload": {"sentences": len(texts), "source": "fastpath.text.corpus.pydoc_sentences(), shuffled (seed 0)",
                     "texts_per_request": 1, "load": "perf_analyzer 2.51 gRPC", "rounds": args.rounds, "passes": args.passes, "warmup_s": args.warmup_s,
                     "duration_s": args.duration_s},
        "wall_s": time.time() - started,
    }
    extras = {key: rounds.pop(key) for key in ("int8_served_cosine",) if key in rounds}
    report.update(summarize(rounds))
    report.update(extras)
    report["goals"] = goals(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
