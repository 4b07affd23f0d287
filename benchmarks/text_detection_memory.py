"""text_detection memory: the stub's peak and steady RSS after the largest legal request, and the speed the
memory settings cost on common small images.

Run from the repository root with the artifacts built (about 12 minutes on the 2-core dev machine):

    .venv/bin/python benchmarks/text_detection_memory.py

Part 1, engine speed, in this process (ONNX Runtime CPU, the shipped artifact and thread count). The
resized shapes of common photos under the shipped min/736 policy, one to four images per call, and the
largest legal call (8 images of 1400x1400, resized to 1408x1408), each run through
``TextDetector.run_batch`` on two engines:

    arena+pattern   one session with ONNX Runtime's CPU arena and memory pattern for every call (ONNX
                    Runtime's defaults: what text_detection ran with before its memory was bounded)
    shipped         ``TextDetectionConfig.cpu_engine_options()`` of the shipped config.pbtxt: arena without
                    the memory pattern up to arena_max_input_bytes (32 MiB), a session without the arena above

``--rounds`` rounds; each runs both engines once per shape, in alternating order, and the ratio
shipped / arena+pattern is taken within the round (the machine is shared; its speed drifts), of wall
time and of this process's CPU time (user + system: page faults show there). The script re-runs itself
with the ``GLIBC_TUNABLES`` that ``fastpath serve`` gives the server when the environment has none. Also
timed: one ``MemoryReturner.after_batch()`` with nothing to return, and one ``malloc_trim(0)``.

Part 2, served memory: a real tritonserver serving text_detection, twice: with the shipped config.pbtxt,
and with ``keep`` (arena for every call, the staging pool keeps its capacity, no heap trim: nothing
returned). A warm-up request (page.png), then the idle stub's RSS; the largest legal request (16 RGB
images of 1400x1400, tests/e2e/test_text_detection_memory.py) twice, each with the stub's peak RSS
(VmHWM, reset before) and its steady RSS once settled; then five page.png requests (median latency).
The predicted peak is ``fastpath.models.text_detection.budget.predict_peak``.

Writes docs/benchmarks/text_detection_memory.json and .md (``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastpath.config import parse_sections  # noqa: E402
from fastpath.engines import load_engine  # noqa: E402
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine  # noqa: E402
from fastpath.memory import BlockPool, MemoryReturner, PageAlignedAllocator, PoolConfig, release_freed_heap  # noqa: E402
from fastpath.models.text_detection.budget import RequestShape, peak_budget, predict_peak  # noqa: E402
from fastpath.models.text_detection.config import DetectionSchedulerConfig, TextDetectionConfig  # noqa: E402
from fastpath.models.text_detection.pipeline import TextDetector  # noqa: E402

SOURCE = REPO / "model_repository" / "text_detection"
# (photo, side it is resized to first or None, images per call): common photos, then the largest legal call
CASES = [("page.png", None, 1), ("coffee.png", None, 1), ("astronaut.png", None, 1), ("text.png", None, 1),
         ("motorcycle_left.png", None, 2), ("chelsea.png", None, 4), ("astronaut.png", 1400, 8)]
KEEP = {"arena_max_input_bytes": str(1 << 62), "staging_keep_idle_bytes": "536870912", "heap_trim_growth_bytes": str(1 << 62)}
MIB = 1 << 20


def shipped_parameters() -> dict[str, str]:
    return dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', (SOURCE / "config.pbtxt").read_text()))


def _timed(detector: TextDetector, prepared: list) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: user + system) of one run_batch."""
    before, start_s = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    detector.run_batch(prepared)
    wall_s, after = time.perf_counter() - start_s, resource.getrusage(resource.RUSAGE_SELF)
    return wall_s, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def engine_speed(rounds: int) -> list[dict]:
    """Part 1: per shape, each engine's median wall and CPU ms, and the median per-round ratios shipped / arena+pattern."""
    import cv2

    from tests.unit.models.text_detection.reference import skimage_rgb

    config, _ = parse_sections(shipped_parameters(), TextDetectionConfig, DetectionSchedulerConfig)
    path = str(SOURCE / "1" / config.artifact)
    engines = {"arena+pattern": OnnxRuntimeEngine(path, intra_op_threads=config.intra_op_threads),
               "shipped": load_engine(config.runtime, path, **config.cpu_engine_options())}
    detectors = {name: TextDetector(engine, config) for name, engine in engines.items()}
    rows = []
    for photo, side, images in CASES:
        image = skimage_rgb(photo) if side is None else cv2.resize(skimage_rgb(photo), (side, side))
        prepared = [detectors["shipped"].prepare(image)] * images
        for detector in detectors.values():
            detector.run_batch(prepared)  # warm-up: first call of the shape
        engines["shipped"].calls_without_arena = 0
        spans = {name: [] for name in detectors}
        for index in range(rounds):
            for name in (list(detectors) if index % 2 == 0 else list(reversed(detectors))):
                spans[name].append(_timed(detectors[name], prepared))
        label = photo if side is None else f"{photo} at {side}x{side}"
        rows.append(_speed_row(label, prepared, spans, engines["shipped"].calls_without_arena > 0))
        print(rows[-1], flush=True)
    for engine in engines.values():
        engine.close()
    return rows


def _speed_row(photo: str, prepared: list, spans: dict, without_arena: bool) -> dict:
    height, width = prepared[0].shape_hw
    old, new = spans["arena+pattern"], spans["shipped"]
    row = {"photo": photo, "images": len(prepared), "resized_hw": [height, width],
           "input_mib": round(len(prepared) * 3 * height * width * 4 / MIB, 1), "without_arena": without_arena}
    for kind, column in (("wall", 0), ("cpu", 1)):
        row[f"arena_{kind}_ms"] = round(statistics.median(span[column] for span in old) * 1e3, 1)
        row[f"shipped_{kind}_ms"] = round(statistics.median(span[column] for span in new) * 1e3, 1)
        row[f"{kind}_ratio"] = round(statistics.median(b[column] / a[column] for a, b in zip(old, new)), 3)
    return row


def returner_costs(calls: int = 200) -> dict:
    """Part 1: microseconds of an after_batch() with nothing to return, and of a malloc_trim(0)."""
    pool = BlockPool(PageAlignedAllocator(), PoolConfig(capacity_bytes=64 * MIB, max_block_bytes=32 * MIB), name="staging")
    pool.lease(16 * MIB).release()
    returner = MemoryReturner([pool], keep_idle_bytes=64 * MIB, trim_growth_bytes=64 * MIB)
    spans = {"after_batch_us": [], "malloc_trim_us": []}
    for _ in range(calls):
        start_s = time.perf_counter()
        returner.after_batch()
        spans["after_batch_us"].append(time.perf_counter() - start_s)
        start_s = time.perf_counter()
        release_freed_heap()
        spans["malloc_trim_us"].append(time.perf_counter() - start_s)
    pool.close()
    return {key: round(statistics.median(values) * 1e6, 1) for key, values in spans.items()}


def build_repository(root: Path, overrides: dict[str, str]) -> Path:
    """text_detection with ``overrides`` applied to its config.pbtxt parameters, artifacts linked in."""
    version = root / "text_detection" / "1"
    version.mkdir(parents=True)
    text = (SOURCE / "config.pbtxt").read_text()
    for key, value in overrides.items():
        text, count = re.subn(rf'(key: "{key}" value: {{ string_value: ")[^"]*(" }})', rf"\g<1>{value}\g<2>", text)
        assert count == 1, f"parameter {key} not found in config.pbtxt"
    (root / "text_detection" / "config.pbtxt").write_text(text)
    for name in ("model.py", "model.onnx", "manifest.json"):
        (version / name).symlink_to(SOURCE / "1" / name)
    return root


def served_memory(variant: str, overrides: dict[str, str], log_dir: Path) -> dict:
    """Part 2 for one config: idle, per request peak/steady/seconds, small-request latency (MiB, s, ms)."""
    from fastpath.memory import process_memory, reset_peak_rss
    from fastpath.server.process import group_members
    from fastpath.server.stubs import list_stubs
    from tests.conftest import start_server
    from tests.e2e.test_text_detection_memory import detect, largest_request, settled_rss
    from tests.unit.models.text_detection.reference import skimage_rgb

    server = start_server(log_dir, models=("text_detection",), repository=build_repository(log_dir / "repository", overrides))
    try:
        (stub,) = [s for s in list_stubs(group_members(server.pid)) if s.model == "text_detection"]
        page = skimage_rgb("page.png")[None]
        detect(server, page)
        idle = settled_rss(stub.pid)
        row = {"variant": variant, "idle_mib": idle >> 20, "requests": []}
        batch = largest_request()
        for _ in range(2):
            reset_peak_rss(stub.pid)
            start_s = time.monotonic()
            detect(server, batch)
            seconds = time.monotonic() - start_s
            peak = process_memory(stub.pid).peak_rss_bytes
            row["requests"].append({"seconds": round(seconds, 1), "peak_mib": peak >> 20,
                                    "steady_mib": settled_rss(stub.pid) >> 20})
        latencies = []
        for _ in range(5):
            start_s = time.monotonic()
            detect(server, page)
            latencies.append(time.monotonic() - start_s)
        row["page_png_ms"] = round(statistics.median(latencies) * 1e3)
        print(row, flush=True)
        return row
    finally:
        server.stop()


def markdown(report: dict) -> str:
    lines = ["# text_detection memory: peak and steady stub RSS, and the speed the memory settings cost", "",
             f"`benchmarks/text_detection_memory.py`: {report['cpus']} CPUs ({report['machine']}), shared dev machine, "
             f"ONNX Runtime {report['onnxruntime']}, `GLIBC_TUNABLES={report['glibc_tunables']}`. Design: [../design/text_detection.md](../design/text_detection.md#memory).", "",
             "## Served: the largest legal request (16 RGB images of 1400x1400), twice", "",
             f"Predicted peak above the idle stub (`predict_peak`): {report['predicted_mib']} MiB; bound for any legal "
             f"request (`peak_budget`): {report['budget_mib']} MiB.", "",
             "| config | idle MiB | request | s | peak MiB | peak - idle | vs predicted | steady MiB | steady / idle | page.png ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["served"]:
        for index, request in enumerate(row["requests"]):
            above = request["peak_mib"] - row["idle_mib"]
            lines.append(f"| {row['variant']} | {row['idle_mib']} | {index + 1} | {request['seconds']} | {request['peak_mib']} | "
                         f"{above} | {above / report['predicted_mib']:.2f} | {request['steady_mib']} | "
                         f"{request['steady_mib'] / row['idle_mib']:.2f} | {row['page_png_ms'] if index else ''} |")
    lines += ["", f"## Engine speed on common images ({report['rounds']} rounds, medians; CPU: this process's user + system time)", "",
              "| photo | images | resized h x w | input MiB | without arena | arena+pattern ms | shipped ms | wall ratio | "
              "arena+pattern CPU ms | shipped CPU ms | CPU ratio |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["speed"]:
        lines.append(f"| {row['photo']} | {row['images']} | {row['resized_hw'][0]}x{row['resized_hw'][1]} | {row['input_mib']} | "
                     f"{'yes' if row['without_arena'] else 'no'} | {row['arena_wall_ms']} | {row['shipped_wall_ms']} | "
                     f"{row['wall_ratio']:.3f} | {row['arena_cpu_ms']} | {row['shipped_cpu_ms']} | {row['cpu_ratio']:.3f} |")
    costs = report["returner"]
    lines += ["", f"Memory return per batch: `after_batch()` with nothing to return {costs['after_batch_us']} us; "
              f"a `malloc_trim(0)` with little to free {costs['malloc_trim_us']} us."]
    return "\n".join(lines) + "\n"


def main() -> None:
    import onnxruntime

    from fastpath.server.process import GLIBC_TUNABLES

    if "GLIBC_TUNABLES" not in os.environ:  # glibc reads its tunables at start: measure as the server runs
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "GLIBC_TUNABLES": GLIBC_TUNABLES})
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "text_detection_memory"),
                        help="path without suffix: writes .json and .md")
    args = parser.parse_args()
    config, sched = parse_sections(shipped_parameters(), TextDetectionConfig, DetectionSchedulerConfig)
    request = RequestShape(images=16, height=1400, width=1400)
    report = {"cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(), "onnxruntime": onnxruntime.__version__,
              "glibc_tunables": os.environ["GLIBC_TUNABLES"],
              "rounds": args.rounds, "predicted_mib": predict_peak(config, sched.batch_buckets, request).total_bytes >> 20,
              "budget_mib": peak_budget(config, sched.batch_buckets).total_bytes >> 20}
    root = Path(tempfile.mkdtemp(prefix="fastpath-detection-memory-"))
    try:
        report["served"] = [served_memory(name, overrides, root / name) for name, overrides in (("shipped", {}), ("keep", KEEP))]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report["speed"] = engine_speed(args.rounds)
    report["returner"] = returner_costs()
    table = markdown(report)
    print(table)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
