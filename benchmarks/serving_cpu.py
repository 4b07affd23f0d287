"""CPU cost of the serving path per request, by process, and what it leaves the engine on this machine.

Run from the repository root with the artifacts built (about 2 minutes on a 2-core machine):

    .venv/bin/python benchmarks/serving_cpu.py

One tritonserver serves echo_embedding (tokenizes and answers zeros: Triton's and the python
backend's own path, no engine), naive_embedding, and FastPath's text_embedding as shipped
(benchmarks/scheduler_cpu.py builds the repository). Each is loaded by the same closed loop of
perf_analyzer (Triton's C++ load generator, gRPC; benchmarks/perf_analyzer.py), one text per request, at
``--concurrency`` (default 32), for ``--duration-s``; per model the CPU seconds of the client (the
perf_analyzer run, from its start to its exit; it writes no per-request export here), tritonserver and the
model's stub process(es) are read with psutil before and after and divided by the requests Triton
answered (its statistics).

The ceiling. On a machine of ``C`` cores whose ideal raw engine (raw_ideal: batches of 64 of equal
length, measured here in a stub) runs ``I`` texts/s, the engine needs ``C / I`` CPU seconds per
text. If serving a request costs ``S`` CPU seconds elsewhere (echo's client + tritonserver + stub),
no served model can exceed ``C / (C / I + S)`` texts/s, i.e. ``1 / (1 + S * I / C)`` of ideal (a
little low: echo's stub also tokenizes, which the raw ideal pays too; CPU seconds and requests include the
requests still in flight when the window closes, ~3% at concurrency 32). Writes
docs/benchmarks/serving_cpu.json and .md (``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

import perf_analyzer as pa  # noqa: E402
from cpu_meter import cpu_seconds, waited_children_seconds  # noqa: E402
from scheduler_cpu import RawEngine, by_length, ideal_sample, load, workload_texts  # noqa: E402
from scheduler_repository import FASTPATH_VARIANTS, build_repository  # noqa: E402

MODELS = ("echo_embedding", "naive_embedding", "text_embedding")


def components(server_pid: int, models: tuple[str, ...]) -> dict[str, list[psutil.Process]]:
    """{"client": [this process, whose waited-for children are the perf_analyzer runs], "tritonserver": [it], "stub:<model>": [its stubs], ...}."""
    server = psutil.Process(server_pid)
    out: dict[str, list[psutil.Process]] = {"client": [psutil.Process()], "tritonserver": [server]}
    for child in server.children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        model = next((m for m in models + ("raw_engine_bench",) if f"/{m}/" in cmdline), "other")
        out.setdefault(f"stub:{model}", []).append(child)
    return out


def served_requests(server, model: str) -> int:
    """Requests ``model`` has answered successfully so far (Triton's statistics, every version)."""
    import tritonclient.grpc as grpcclient

    stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(model, as_json=True)["model_stats"]
    return sum(int(version["inference_stats"]["success"].get("count", 0)) for version in stats)


def measure(server, model: str, data: Path, concurrency: int, args) -> dict:
    """Throughput and CPU ms per request of each process while perf_analyzer keeps ``concurrency`` requests of
    ``model`` in flight for ``args.duration_s`` (texts from ``data``). perf_analyzer writes no profile export here
    (it would cost its CPU per response): the requests are Triton's success count over the run, those in flight
    when it ends included."""
    procs = components(server.pid, MODELS + tuple(args.extra))

    def used_s() -> dict[str, float]:  # the client: the perf_analyzer run, exited and waited for by the second call
        used = {name: sum(cpu_seconds(p) for p in group) for name, group in procs.items() if name != "client"}
        return {"client": waited_children_seconds(), **used}

    before, served = used_s(), served_requests(server, model)
    started = time.perf_counter()
    result = pa.timed(pa.find(), pa.Load(model=model, url=server.grpc_url, data=data, concurrency=concurrency), args.duration_s, None)
    wall = time.perf_counter() - started
    after, requests = used_s(), served_requests(server, model) - served
    if result.errors or not requests:
        raise pa.PerfAnalyzerError(f"{model}: {requests} requests served, failures: {result.errors[:1]}", result.errors)
    used = {name: after[name] - before[name] for name in procs}
    own = {"client": used["client"], "tritonserver": used["tritonserver"], "stub": used.get(f"stub:{model}", 0.0)}
    return {"texts_per_s": round(requests / (result.ended_s - result.started_s), 1), "errors": 0,
            "cpu_ms_per_request": {k: round(v / requests * 1e3, 3) for k, v in own.items()},
            "cores": {k: round(v / wall, 3) for k, v in own.items()},
            "other_processes_cores": round(sum(v for k, v in used.items() if k not in ("client", "tritonserver", f"stub:{model}")) / wall, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "serving_cpu")
    parser.add_argument("--extra", nargs="*", default=[], choices=sorted(FASTPATH_VARIANTS),
                        help="FastPath variants (benchmarks/scheduler_repository.py FASTPATH_VARIANTS) measured beside the three models")
    args = parser.parse_args(argv)
    models = MODELS + tuple(args.extra)

    from conftest import start_server

    texts = workload_texts()
    lengths, sorted_texts = by_length(texts)
    cores = len(os.sched_getaffinity(0))
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fastpath-serving-cpu-") as tmp:
        data = pa.write_input_data(Path(tmp) / "texts.json", pa.text_entries(texts))
        server = start_server(Path(tmp), models=models + ("raw_engine_bench",), repository=build_repository(Path(tmp)))
        try:
            raw = RawEngine(server, texts, sum(lengths) / len(lengths))
            raw.measure("raw_ideal", ideal_sample(sorted_texts, 0))  # warm-up
            for index in range(args.rounds):
                cells = {"raw_ideal": raw.measure("raw_ideal", ideal_sample(sorted_texts, index))["throughput_per_s"]}
                for model in (models if index % 2 == 0 else models[::-1]):
                    load(server.grpc_url, model, texts, args.concurrency, 0.0, 1.0)  # warm
                    cells[model] = measure(server, model, data, args.concurrency, args)
                cells["raw_ideal"] = (cells["raw_ideal"] + raw.measure(
                    "raw_ideal", ideal_sample(sorted_texts, index + 1))["throughput_per_s"]) / 2
                rounds.append(cells)
                print(f"round {index}: raw_ideal {cells['raw_ideal']:.0f}/s  " + "  ".join(
                    f"{m} {cells[m]['texts_per_s']}/s {cells[m]['cpu_ms_per_request']}" for m in models), flush=True)
        finally:
            server.stop()
    report = summarize(rounds, cores, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def summarize(rounds: list[dict], cores: int, args) -> dict:
    """Medians over rounds per model, and each round's ceiling from echo's serving cost."""
    models = {}
    for model in MODELS + tuple(args.extra):
        cells = [r[model] for r in rounds]
        models[model] = {
            "texts_per_s": statistics.median(c["texts_per_s"] for c in cells),
            "cpu_ms_per_request": {k: round(statistics.median(c["cpu_ms_per_request"][k] for c in cells), 3)
                                   for k in cells[0]["cpu_ms_per_request"]},
            "vs_ideal": round(statistics.median(r[model]["texts_per_s"] / r["raw_ideal"] for r in rounds), 3),
            "other_processes_cores_max": max(c["other_processes_cores"] for c in cells),
        }
    ceilings = []
    for r in rounds:
        serving_s = sum(r["echo_embedding"]["cpu_ms_per_request"].values()) / 1e3
        ceilings.append(1 / (1 + serving_s * r["raw_ideal"] / cores))
    return {"command": " ".join([".venv/bin/python benchmarks/serving_cpu.py"] + sys.argv[1:]),
            "cores": cores, "concurrency": args.concurrency, "rounds": args.rounds, "duration_s": args.duration_s,
            "raw_ideal_per_s": [round(r["raw_ideal"], 1) for r in rounds], "models": models,
            "per_round": rounds,
            "ceiling_vs_ideal": round(statistics.median(ceilings), 3),
            "ceiling_vs_ideal_rounds": [round(c, 3) for c in ceilings]}


def markdown(report: dict) -> str:
    lines = ["# Serving-path CPU per request (benchmarks/serving_cpu.py)", "",
             f"Command: `{report['command']}`. {report['cores']} cores, concurrency {report['concurrency']}, "
             f"{report['rounds']} rounds of {report['duration_s']:g} s per model; raw ideal per round "
             f"{report['raw_ideal_per_s']} texts/s. Medians over rounds.", "",
             "| model | texts/s | vs ideal | client ms/req | tritonserver ms/req | stub ms/req | other processes (cores, max) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for model, cell in report["models"].items():
        cpu = cell["cpu_ms_per_request"]
        lines.append(f"| {model} | {cell['texts_per_s']} | {cell['vs_ideal']} | {cpu['client']} | {cpu['tritonserver']} | "
                     f"{cpu['stub']} | {cell['other_processes_cores_max']} |")
    lines += ["", f"Ceiling for any served model, from echo's serving CPU and the raw ideal (see the module docstring): "
                  f"**{report['ceiling_vs_ideal']}** of ideal (rounds {report['ceiling_vs_ideal_rounds']})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
