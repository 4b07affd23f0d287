"""Client-side ``fastpath`` commands, built on the ``fastpath_client`` SDK: ``fastpath bench``.

    fastpath bench --model text_embedding --concurrency 1,8,32 --duration-s 15 --out bench/
    fastpath bench --model text_embedding --request-rate 20,40 --poisson --protocol grpc --url localhost:8001

``bench`` is a load generator in the spirit of perf_analyzer (see ``fastpath_client.loadgen``): for each
concurrency (closed loop) or request rate (open loop) it warms up, measures windows until three in a
row agree within ``--stability-pct``, and reports throughput, p50/p90/p99/max latency, errors and
Triton's server-side split (queue, compute_input, compute_infer, compute_output). It writes
``DIR/bench_<model>_<protocol>.json`` and ``.png`` and prints a table. Inputs are real: text inputs get
sentences from Python's own documentation (``fastpath.text.corpus``); image inputs get photos from
scikit-image when it is installed; other numeric inputs get seeded random values of ``--shape``.
Triton's statistics stop when a model's ``execute()`` returns, and FastPath models answer later from
their scheduler, so the split also takes FastPath's queue wait and batch run from Triton's metrics
port (``--metrics-url``; ``fastpath_client.server_metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import logging
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.cli.common import URL_DEFAULT, bounded, bounded_number, default_url, env_int, error_line, plain_help, port_hint
from fastpath.errors import BenchError

LOG = logging.getLogger("fastpath")
POOL_REQUESTS = 64
SERVER_WAIT_S = 60.0  # how long bench waits for a server (or the model) that is still starting
SERVER_QUIET_S = 2.0  # how long it waits for the server before saying that it waits
METRICS_PORT = 8002  # Triton's default metrics port


def _list(text: str, kind: type, lowest: float, strict: bool, what: str) -> list:
    items = text.split(",")
    if not text.strip() or any(not v.strip() for v in items):  # "1,,2" or "1,8,": an item left out by mistake
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what} without empty items, got {text!r}")
    try:
        return [bounded_number(v, kind, lowest, strict, what) for v in items]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} in {text!r}" if len(items) > 1 else str(exc)) from None


def _metrics_url(text: str) -> str:
    """``--metrics-url``: HOST:PORT, or ``none``."""
    from fastpath_client.checks import host_port
    from fastpath_client.errors import InvalidInputError

    if text == "none":
        return text
    try:
        host_port(text)
    except InvalidInputError:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT of Triton's metrics port (its default {METRICS_PORT}) or "
                                         f"'none', got {text!r}") from None
    return text


def _int_list(text: str) -> list[int]:
    """Concurrencies: positive integers, e.g. ``1,8,32``."""
    return _list(text, int, 1, False, "concurrent requests, whole numbers")


def _float_list(text: str) -> list[float]:
    """Request rates: positive numbers of requests/s, e.g. ``10,20.5``."""
    return _list(text, float, 0, True, "requests per second")


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.partition(":")
    if not name or not dims:
        raise argparse.ArgumentTypeError(f"--shape wants NAME:d1,d2,... (perf_analyzer style), got {text!r}")
    return name, tuple(int(d) for d in dims.split(","))


def register(subparsers: Any) -> None:
    """Add the client-side commands to the ``fastpath`` parser's subparsers."""
    bench = subparsers.add_parser(
        "bench", help="load-test a served model (concurrency sweep or request rate); writes JSON + PNG",
        description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--model", default="text_embedding", help="the served model to put under load (default text_embedding)")
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=_int_list, default=None, help="closed-loop sweep, e.g. 1,8,32 (default 1,8,32)")
    mode.add_argument("--request-rate", type=_float_list, default=None, help="open-loop sweep in requests/s, e.g. 10,20")
    bench.add_argument("--poisson", action="store_true", help="Poisson arrivals in --request-rate mode (default constant gaps)")
    bench.add_argument("--duration-s", type=bounded(float, 0, True, "seconds"), default=15.0,
                       help="measurement per configuration, split into 3 windows (default 15)")
    bench.add_argument("--warmup-s", type=bounded(float, 0, False, "seconds"), default=None,
                       help="warm-up per configuration (default min(5, duration/3))")
    bench.add_argument("--max-windows", type=bounded(int, 1, False, "windows"), default=6,
                       help="stop after this many windows even if not stable (at least 3 run; default 6)")
    bench.add_argument("--stability-pct", type=bounded(float, 0, True, "percent"), default=10.0,
                       help="windows must agree within this percent (default 10)")
    bench.add_argument("--url", default=None, help=f"HOST:PORT of Triton. {URL_DEFAULT}")
    bench.add_argument("--protocol", choices=("http", "grpc"), default="http")
    bench.add_argument("--metrics-url", type=_metrics_url, default=None,
                       help=f"HOST:PORT of Triton's metrics port, for FastPath's share of the server time "
                            f"(default --url's host, port $METRICS_PORT or {METRICS_PORT}; 'none': Triton's statistics only)")
    bench.add_argument("--batch-size", type=bounded(int, 1, False, "items per request"), default=1,
                       help="items (texts, images) per request (default 1)")
    bench.add_argument("--shape", type=_shape, action="append", default=[], help="NAME:d1,d2 for inputs with -1 dims")
    bench.add_argument("--shared-memory", choices=("auto", "always", "never"), default="never",
                       help="send large inputs through system shared memory (default never: like perf_analyzer)")
    bench.add_argument("--timeout-s", type=bounded(float, 0, True, "seconds"), default=30.0,
                       help="per-request timeout; a timeout counts as an error (default 30)")
    bench.add_argument("--out", type=Path, default=Path("bench-results"),
                       help="directory for the JSON and PNG (default: bench-results in the current directory)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)


def _text_input(spec: Any, tensor: Any, batch: int, index: int) -> np.ndarray:
    from fastpath.text.corpus import pydoc_sentences

    sentences = pydoc_sentences()
    texts = np.empty(batch, dtype=np.object_)  # object array of bytes: numpy S would drop trailing NULs
    for k in range(batch):
        texts[k] = sentences[(index * batch + k) % len(sentences)].encode()
    dims = ((batch,) if spec.max_batch_size > 0 else ()) + tensor.dims
    shape = tuple(batch if d == -1 else d for d in dims)
    if int(np.prod(shape)) != batch:
        raise SystemExit(f"input {tensor.name} dims {list(tensor.dims)} do not take {batch} text(s) per request")
    return texts.reshape(shape)


@functools.lru_cache(maxsize=1)
def _photos() -> list[np.ndarray]:
    """Real RGB photos that ship in scikit-image's wheel (none when it is not installed)."""
    try:
        import skimage.data as data
    except ImportError:
        return []
    return [getattr(data, name)() for name in ("astronaut", "coffee", "chelsea", "rocket")]


def _is_image(tensor: Any) -> bool:
    return tensor.datatype == "UINT8" and len(tensor.dims) in (3, 4) and tensor.dims[-1] in (3, -1)


def _numeric(spec: Any, tensor: Any, batch: int, shapes: dict, rng: np.random.Generator, index: int) -> np.ndarray:
    photos = _photos() if _is_image(tensor) and tensor.name not in shapes else []
    if photos:
        photo = photos[index % len(photos)]
        stacked = spec.max_batch_size > 0 or len(tensor.dims) == 4
        return np.stack([photo] * batch) if stacked else photo
    dims = shapes.get(tensor.name, tensor.dims)
    if any(d < 0 for d in dims):
        raise SystemExit(f"input {tensor.name} has dims {list(tensor.dims)}: give --shape {tensor.name}:d1,d2,...")
    full = ((batch,) if spec.max_batch_size > 0 else ()) + tuple(dims)
    from tritonclient.utils import triton_to_np_dtype

    dtype = np.dtype(triton_to_np_dtype(tensor.datatype))
    if dtype.kind in "iub":
        return rng.integers(0, 2 if dtype.kind == "b" else 127, full).astype(dtype)
    return rng.standard_normal(full).astype(dtype)


def _chosen_inputs(spec: Any, shapes: dict) -> list[Any]:
    """Required inputs and those given a --shape; when every input is optional (one-of inputs, like
    text_detection's IMAGE / IMAGE_BYTES), the first image input, else the first input."""
    chosen = [t for t in spec.inputs if not t.optional or t.name in shapes]
    if chosen or not spec.inputs:
        return chosen
    return [next((t for t in spec.inputs if _is_image(t) and _photos()), spec.inputs[0])]


def input_pool(spec: Any, batch: int, shapes: dict[str, tuple[int, ...]]) -> list[dict[str, np.ndarray]]:
    """``POOL_REQUESTS`` distinct requests for ``spec``: real sentences for BYTES inputs, photos or
    seeded random values for numeric ones.

    Raises:
        BenchError: ``batch`` above the model's ``max_batch_size``.
    """
    if 0 < spec.max_batch_size < batch:  # Triton would refuse every request of the sweep
        raise BenchError(f"--batch-size {batch}: model {spec.name} takes at most {spec.max_batch_size} items per request "
                         "(max_batch_size in its config.pbtxt)")
    rng = np.random.default_rng(0)
    pool = []
    for index in range(POOL_REQUESTS):
        request = {}
        for tensor in _chosen_inputs(spec, shapes):
            if tensor.datatype == "BYTES":
                request[tensor.name] = _text_input(spec, tensor, batch, index)
            else:
                request[tensor.name] = _numeric(spec, tensor, batch, shapes, rng, index)
        pool.append(request)
    return pool


class _Progress:
    """A tqdm bar per configuration (a log line when tqdm is missing or --no-progress)."""

    def __init__(self, label: str, enabled: bool) -> None:
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=100, desc=f"bench {label}", unit="%", bar_format="{desc}: {bar} {n:.0f}% {postfix}")
            except ImportError:
                LOG.info("bench %s running (pip install 'fastpath[plots]' for a progress bar)", label)

    def __call__(self, elapsed_s: float, planned_s: float, completed: int) -> None:
        if self._bar is not None:
            self._bar.n = min(99.0, 100.0 * elapsed_s / planned_s)
            self._bar.set_postfix_str(f"{completed} responses, {completed / max(elapsed_s, 1e-9):.1f}/s")

    def close(self, *, finished: bool) -> None:
        """End the bar: at 100% when the configuration ``finished``, else (Ctrl-C, a failure) where it stopped."""
        if self._bar is not None:
            if finished:
                self._bar.n = 100
            self._bar.close()


def _settings(args: argparse.Namespace) -> list[Any]:
    from fastpath_client.loadgen import LoadSettings

    window_s = args.duration_s / 3
    warmup_s = args.warmup_s if args.warmup_s is not None else min(5.0, args.duration_s / 3)
    common = dict(model=args.model, window_s=window_s, warmup_s=warmup_s, stable_windows=3,
                  max_windows=max(3, args.max_windows), stability_pct=args.stability_pct,
                  timeout_s=args.timeout_s, items_per_request=args.batch_size)
    if args.request_rate:
        return [LoadSettings(request_rate=r, poisson=args.poisson, **common) for r in args.request_rate]
    return [LoadSettings(concurrency=c, **common) for c in (args.concurrency or [1, 8, 32])]


async def _wait_for_model(client: Any, model: str, protocol: str) -> None:
    """Wait for the server, then for ``model``; fail at once when the server does not know the model.

    Raises:
        BenchError: the server did not come up within SERVER_WAIT_S (with :func:`port_hint`).
        ModelNotFoundError: the server does not serve ``model`` (unknown, or not loaded).
        RequestTimeoutError: the model did not become ready within SERVER_WAIT_S (the message gives its state).
        ProtocolMismatchError: ``--url`` answers the other protocol.
    """
    from fastpath_client import FastPathClientError, ModelNotFoundError, RequestTimeoutError

    try:
        try:  # a server that answers (or answers the other protocol: ProtocolMismatchError) is known at once
            await client.wait_ready(timeout_s=min(SERVER_QUIET_S, SERVER_WAIT_S))
        except RequestTimeoutError:  # say why nothing happens for up to a minute
            print(f"fastpath bench: the server at {client.url} is not ready yet; waiting up to {SERVER_WAIT_S:g} s "
                  "for it to start", file=sys.stderr, flush=True)
            await client.wait_ready(timeout_s=SERVER_WAIT_S)
    except RequestTimeoutError as exc:
        raise BenchError(f"{exc}; {port_hint(protocol)}") from exc
    if await client.ready(model):
        return
    try:  # an unknown model is a 404 at once; one that is loading says "no available versions"
        await client.model_config(model)
    except ModelNotFoundError:
        raise
    except FastPathClientError:
        pass  # loading (or failed to load): wait_ready names its state if it does not come up
    await client.wait_ready(timeout_s=SERVER_WAIT_S, models=[model])


def default_metrics_url(given: str | None, url: str) -> str:
    """``--metrics-url`` when given, else ``url``'s host with ``$METRICS_PORT`` (the variable `make serve` reads)
    or Triton's default 8002."""
    return given or f"{url.rsplit(':', 1)[0]}:{env_int('METRICS_PORT', METRICS_PORT)}"


async def _fastpath_snapshot(args: argparse.Namespace, url: str) -> Any:
    """A snapshot of FastPath's queued-path seconds from the metrics port, or None (``--metrics-url none``,
    or the port does not answer: then a warning says the split has Triton's phases only)."""
    from fastpath_client.server_metrics import queued_seconds, scrape

    metrics_url = default_metrics_url(args.metrics_url, url)
    if metrics_url == "none":
        return None

    async def snapshot() -> dict[str, float]:
        return queued_seconds(await scrape(metrics_url), args.model)

    try:
        await snapshot()
    except (OSError, ValueError) as exc:
        LOG.warning("no FastPath metrics at %s (%s): the time split has Triton's phases only; set --metrics-url",
                    metrics_url, exc)
        return None
    return snapshot


async def _run_all(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from fastpath_client import NO_RETRY, AsyncClient
    from fastpath_client.loadgen import LoadRun

    settings = _settings(args)
    async with AsyncClient(url, args.protocol, retry=NO_RETRY, timeout_s=args.timeout_s, max_in_flight=None,
                           shared_memory=args.shared_memory) as client:  # the load sets the concurrency
        await _wait_for_model(client, args.model, args.protocol)
        spec = await client.model_config(args.model)
        pool = input_pool(spec, args.batch_size, dict(args.shape))
        fastpath_metrics = await _fastpath_snapshot(args, url)
        results = []
        for position, setting in enumerate(settings):
            progress = _Progress(setting.label, not args.no_progress)
            try:
                run = LoadRun(client, setting, lambda i: pool[i % len(pool)], on_progress=progress,
                              fastpath_metrics=fastpath_metrics)
                results.append(await run.run())
            finally:
                progress.close(finished=len(results) > position)
    first = settings[0]
    return {
        "tool": "fastpath bench", "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "url": url, "protocol": args.protocol, "model": args.model,
        "inputs": {t.name: [t.datatype, list(t.dims)] for t in spec.inputs},
        "fastpath_metrics": fastpath_metrics is not None,
        "settings": {"items_per_request": args.batch_size, "window_s": first.window_s, "warmup_s": first.warmup_s,
                     "stable_windows": first.stable_windows, "max_windows": first.max_windows,
                     "stability_pct": first.stability_pct, "shared_memory": args.shared_memory},
        "results": results,
    }


def _table(report: dict[str, Any]) -> str:
    head = (f"{'config':>10} {'stable':>6} {'resp/s':>8} {'items/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
            f"{'max ms':>8} {'errors':>6} {'queue us':>9} {'infer us':>9} {'fp q us':>9} {'fp run us':>9} {'batch':>5}")
    rows = [head]
    for r in report["results"]:
        lat, srv = r["latency_ms"], r["server"]
        rows.append(f"{r['label']:>10} {str(r['stable']):>6} {r['throughput_per_s']:8.1f} {r['items_per_s']:8.1f} "
                    f"{lat['p50']:8.2f} {lat['p90']:8.2f} {lat['p99']:8.2f} {lat['max']:8.2f} {r['errors']:6d} "
                    f"{srv['queue_us']:9.0f} {srv['compute_infer_us']:9.0f} {srv.get('fastpath_queue_us', math.nan):9.0f} "
                    f"{srv.get('fastpath_batch_run_us', math.nan):9.0f} {srv['avg_batch_size']:5.1f}")
    rows += [f"{r['label']}: {r['note']}" for r in report["results"] if r.get("note")]
    return "\n".join(rows)


def _unwritable(directory: Path) -> str | None:
    """Why the results could not be written into ``directory`` (created here if missing), or None."""
    try:
        directory.mkdir(parents=True, exist_ok=True)  # raises for a file of that name too
    except OSError as exc:
        return f"cannot create it ({exc.strerror})"
    return None if os.access(directory, os.W_OK | os.X_OK) else "not writable"


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the sweep, write DIR/bench_<model>_<protocol>.json and .png, print a table.

    Returns 0, or 1 when any configuration had errors (samples are in the JSON and the log), or when
    bench could not run (server unreachable, another protocol on --url, unknown model: one line on stderr).
    """
    from fastpath_client import FastPathClientError, ModelNotFoundError
    from fastpath_client.report import write_json, write_png

    url = args.url or default_url(args.protocol)
    problem = _unwritable(args.out)
    if problem:  # before the sweep, not after minutes of load whose results would be lost
        print(f"fastpath bench: --out {args.out}: {problem}; choose a directory you can write", file=sys.stderr)
        return 1
    try:
        report = asyncio.run(_run_all(args, url))
    except BenchError as exc:
        print(f"fastpath bench: {exc}", file=sys.stderr)
        return 1
    except FastPathClientError as exc:
        hint = (f"; the server does not serve it: check the name, or load it (`fastpath serve --model {args.model}`)"
                if isinstance(exc, ModelNotFoundError) else "")
        print(f"fastpath bench: {error_line(exc, args.protocol, url_given=bool(args.url))}{hint}", file=sys.stderr)
        return 1
    stem = args.out / f"bench_{args.model}_{args.protocol}"
    json_path = write_json(report, stem.with_suffix(".json"))
    png_path = write_png(report, stem.with_suffix(".png"))
    print(_table(report))
    LOG.info("wrote %s and %s", json_path, png_path)
    failed = [r for r in report["results"] if r["errors"]]
    for r in failed:
        LOG.error("%s: %d of %d requests failed, e.g. %s", r["label"], r["errors"], r["requests"], r["error_samples"][:1])
    return 1 if failed else 0
