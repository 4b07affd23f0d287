"""tritonserver's memory over repeated reloads of text_embedding, once per malloc.

The GPU soak (benchmarks/gpu/soak.py) found tritonserver's RSS flat while serving and across live swaps, but one
step up at every reload of the model (two reloads by config override, one after a killed stub). Triton's model
management guide says growth over load/unload cycles may be glibc malloc keeping freed memory rather than a leak,
and suggests tcmalloc or jemalloc through ``LD_PRELOAD``. This benchmark tells the two apart: for each malloc it
starts ``fastpath serve`` (the soak's :class:`soak_parts.ServedProduct`), reloads text_embedding ``--reloads``
times through Triton's repository API with a config override (the soak's reload), with perf_analyzer at ``--concurrency`` sending short sentences throughout (0: no load), and
reads tritonserver's RSS (``/proc/PID/status``), its GPU memory (nvidia-smi, with
``--device cuda``) and the stubs' RSS after each reload has settled.

    python benchmarks/gpu/reload_memory.py --device cuda --reloads 8 \
        --malloc glibc --malloc jemalloc=/path/libjemalloc.so.2 --malloc tcmalloc=/path/libtcmalloc_minimal.so.4 \
        --out /tmp/reload_memory.json

A ``--malloc`` is one of: ``glibc`` (``FASTPATH_MALLOC=glibc``: no preload anywhere); ``NAME=LIBRARY``
(``FASTPATH_MALLOC=glibc`` and ``LD_PRELOAD=LIBRARY`` for every process: ``fastpath serve``, tritonserver and the
stubs); ``served`` (``FASTPATH_MALLOC=tcmalloc``: what ``fastpath serve`` ships, tcmalloc in tritonserver alone,
:mod:`fastpath.server.malloc`); ``served,VAR=VALUE,...`` (``served`` with more variables, such as tcmalloc's
``TCMALLOC_AGGRESSIVE_DECOMMIT=true``).

Prints a table (MiB after each reload and the slope over the reloads after the first, MiB per reload: a least-squares
fit) and writes the JSON to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]

import perf_analyzer as pa  # noqa: E402
import soak_parts  # noqa: E402
import stub_probes  # noqa: E402
from soak_actions import load_with_config, reload_config  # noqa: E402


def slope_mib_per_reload(values: list[float]) -> float | None:
    """Least-squares slope of ``values[1:]`` against their index (the first reload warms caches), MiB per reload;
    None with fewer than three values (``--reloads 1``: the table prints "-")."""
    tail = values[1:]
    if len(tail) < 2:
        return None
    return round(float(np.polyfit(np.arange(len(tail)), np.asarray(tail, dtype=float), 1)[0]), 2)


def sample(product: soak_parts.ServedProduct, gpu: bool) -> dict:
    """MiB: tritonserver's RSS and its anonymous, file and shared parts (``RssAnon``, ``RssFile``, ``RssShmem``:
    the heap, mapped libraries, the python backend's shared-memory regions), the text_embedding stubs' summed RSS,
    and tritonserver's GPU memory (None on CPU)."""
    from fastpath.memory.reclaim import process_memory

    triton = process_memory(product.triton_pid)
    stubs = sum(soak_parts.process_rss_bytes(stub.pid) or 0 for stub in product.stubs())
    gpu_mib = None
    if gpu:
        used, unread = stub_probes.gpu_memory_mib()
        gpu_mib = None if unread else used.get(product.triton_pid)
    sizes = {"triton_rss": triton.rss_bytes, "triton_anon": triton.anon_bytes, "triton_file": triton.file_bytes,
             "triton_shmem": triton.shmem_bytes, "stubs_rss": stubs}
    return {**{f"{key}_mib": round(value / 2**20, 1) for key, value in sizes.items()}, "triton_gpu_mib": gpu_mib}


def variant_environment(name: str, library: str | None) -> dict[str, str]:
    """The variables ``fastpath serve`` is started with for ``--malloc name[=library]`` (module docstring);
    ``served,VAR=VALUE,...`` adds those variables to ``served``'s (tcmalloc's own settings, for example)."""
    if name.startswith("served"):
        extra = dict(pair.split("=", 1) for pair in name.split(",")[1:])
        return {"FASTPATH_MALLOC": "tcmalloc", **extra}
    return {"FASTPATH_MALLOC": "glibc", **({"LD_PRELOAD": library} if library else {})}


def run_one(name: str, library: str | None, args: argparse.Namespace) -> dict:
    """Serve under ``name``'s malloc (:func:`variant_environment`), reload ``args.reloads`` times, sample after each."""
    from fastpath.server.triton_api import RepositoryApi

    workdir = Path(args.workdir) / name
    workdir.mkdir(parents=True, exist_ok=True)
    variables = variant_environment(name, library)
    product = soak_parts.ServedProduct(args.device, workdir, args.ready_timeout_s, env=variables).start()
    gpu = args.device == "cuda"
    samples, reload_s, load = [], [], None
    try:
        if args.concurrency:
            from fastpath.text.corpus import pydoc_sentences

            data = pa.write_input_data(workdir / "texts.json", pa.text_entries(pydoc_sentences()))
            load = pa.TimedRun(pa.find(), pa.Load(model=soak_parts.MODEL, url=product.grpc_url, data=data,
                                                  concurrency=args.concurrency), None).start()
        time.sleep(args.settle_s)
        samples.append(sample(product, gpu))
        for index in range(args.reloads):
            began = time.monotonic()
            config = reload_config(RepositoryApi(product.http_url).config(soak_parts.MODEL, "1"))
            load_with_config(product.http_url, product.admin_key, config)
            reload_s.append(round(time.monotonic() - began, 2))
            time.sleep(args.settle_s)
            samples.append(sample(product, gpu))
            print(f"  {name:<9} reload {index + 1:>2}: {samples[-1]}", flush=True)
        if load is not None:
            load.stop(timeout_s=120)
    finally:
        if load is not None:
            load.__exit__(None, None, None)
        product.stop()
    series = {key: [s[key] for s in samples] for key in samples[0]}
    return {"malloc": name, "environment": variables, "concurrency": args.concurrency, "reload_s": reload_s, "samples": samples,
            "slope_mib_per_reload": {key: slope_mib_per_reload(values) for key, values in series.items()
                                     if all(v is not None for v in values)}}


def table(results: list[dict]) -> str:
    lines = [f"{'malloc':<9} {'series':<15} {'start':>7} {'after 1':>8} {'last':>7}  MiB/reload (after the first)"]
    for result in results:
        for key, slope in result["slope_mib_per_reload"].items():
            values = [s[key] for s in result["samples"]]
            lines.append(f"{result['malloc']:<9} {key.removesuffix('_mib'):<15} {values[0]:>7.1f} {values[1]:>8.1f} "
                         f"{values[-1]:>7.1f}  {'-' if slope is None else f'{slope:+.2f}'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--reloads", type=int, default=8)
    parser.add_argument("--malloc", action="append", default=[],
                        help="glibc, NAME=LIBRARY (LD_PRELOAD for every process) or served (fastpath serve's own "
                             "tcmalloc in tritonserver); glibc alone when none is given")
    parser.add_argument("--concurrency", type=int, default=64, help="perf_analyzer's load during the reloads; 0: none")
    parser.add_argument("--settle-s", type=float, default=3.0, help="wait after a reload before sampling")
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    parser.add_argument("--workdir", default="/tmp/reload_memory")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = []
    for spec in args.malloc or ["glibc"]:
        name, _, library = (spec, "", "") if spec.startswith("served") else spec.partition("=")
        if library and not Path(library).is_file():
            raise SystemExit(f"--malloc {spec}: no file {library}")
        results.append(run_one(name, library or None, args))
    report = {"command": " ".join(sys.argv), "machine": platform.node(), "device": args.device,
              "reloads": args.reloads, "settle_s": args.settle_s, "results": results}
    print(table(results))
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
