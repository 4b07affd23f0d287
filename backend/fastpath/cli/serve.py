"""``fastpath serve``: tritonserver on the model repository, with stub supervision and the admin key.

By default it loads every model of the model repository (each directory holding a ``config.pbtxt``),
as Triton does; ``--model NAME`` (repeatable) loads exactly the models named. ``--device cuda``
serves ``text_embedding`` from its GPU configuration, ``configs/gpu.pbtxt`` (Triton's
``--model-config-name=gpu``; :mod:`fastpath.server.devices`), and refuses at once on a machine
where torch sees no CUDA device; ``--device auto`` picks ``cuda`` when torch sees one.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fastpath.cli.common import (
    DEFAULT_REPOSITORY,
    MIN_ADMIN_KEY_CHARS,
    bounded,
    env_port_option,
    positive_seconds,
)
from fastpath.server.triton_api import admin_key_file

if TYPE_CHECKING:
    from fastpath.server.devices import CudaReport
    from fastpath.server.process import ServerOptions, TritonServer
    from fastpath.server.stubs import StubSupervisor

LOG = logging.getLogger("fastpath")


def repository_models(model_repository: Path) -> list[str]:
    """The models of a Triton model repository: its subdirectories holding a ``config.pbtxt``, sorted.

    Raises:
        SystemExit: the directory does not exist or holds no model.
    """
    if not model_repository.is_dir():
        raise SystemExit(f"--model-repository {model_repository} is not a directory")
    models = sorted(p.parent.name for p in model_repository.glob("*/config.pbtxt"))
    if not models:
        raise SystemExit(f"--model-repository {model_repository} holds no model (no */config.pbtxt)")
    return models


def _admin_key() -> tuple[str, bool]:
    """(key, generated): FASTPATH_ADMIN_KEY, or a fresh key that :func:`_publish_admin_key` writes once serving."""
    key = os.environ.get("FASTPATH_ADMIN_KEY", "")
    if key:
        LOG.info("admin key: from FASTPATH_ADMIN_KEY (swap/rollback and Triton's model-repository API need it)")
        if len(key) < MIN_ADMIN_KEY_CHARS:
            LOG.warning("FASTPATH_ADMIN_KEY has %d characters, fewer than %d: anyone who guesses it can load and unload "
                        "models and swap versions (the container entrypoint refuses such a key; `openssl rand -base64 32` "
                        "makes a good one)", len(key), MIN_ADMIN_KEY_CHARS)
        return key, False
    import secrets

    return secrets.token_urlsafe(24), True


def _publish_admin_key(key: str, ports: tuple[int, ...]) -> None:
    """Write a generated key (0600) for each port and as the latest, only once the server is ready:
    a serve that fails to start (port in use) must not replace the key of one that is running. Where no file can
    be written (no home directory, a read-only one) the server keeps serving and a warning says to set the key."""
    try:
        for path in [admin_key_file(port) for port in ports] + [admin_key_file()]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(key + "\n")
    except (OSError, RuntimeError) as exc:
        LOG.warning("admin key: FASTPATH_ADMIN_KEY was not set and the generated key could not be written (%s): "
                    "swap, rollback and Triton's model-repository API are refused until you restart with "
                    "FASTPATH_ADMIN_KEY set", exc)
        return
    LOG.info("admin key: FASTPATH_ADMIN_KEY was not set, generated one in %s (and %s); `fastpath swap` finds it "
             "there, or run `export FASTPATH_ADMIN_KEY=$(cat %s)` (set it before `make serve` to choose the key)",
             admin_key_file(ports[0]), admin_key_file(), admin_key_file(ports[0]))


def _withdraw_admin_key(key: str, ports: tuple[int, ...]) -> None:
    """At exit: remove the key files :func:`_publish_admin_key` wrote that still hold ``key`` (a
    server started since on the same ports has written its own: those stay)."""
    try:
        paths = [admin_key_file(port) for port in ports] + [admin_key_file()]
    except RuntimeError:  # no home directory: nothing was written
        return
    for path in paths:
        try:
            if path.read_text().strip() == key:
                path.unlink()
        except OSError:
            continue


# tritonserver flags fastpath serve sets and relies on, with what to use instead of --triton-arg
MANAGED_TRITON_FLAGS = {
    **dict.fromkeys(("--http-port", "--grpc-port", "--metrics-port"), "use fastpath serve's flag of that name"),
    **dict.fromkeys(("--http-address", "--grpc-address"), "use --host"),
    "--model-repository": "use --model-repository", "--load-model": "use --model", "--log-verbose": "use --log-verbose",
    "--model-config-name": "use --device",
    **dict.fromkeys(("--model-control-mode", "--strict-readiness", "--exit-on-error", "--allow-metrics", "--backend-directory",
                     "--http-restricted-api", "--grpc-restricted-protocol"), "its supervision, swaps and admin key need it"),
}


def serve_options(args: argparse.Namespace, admin_key: str, probe: Callable[[], CudaReport] | None = None) -> ServerOptions:
    """The tritonserver options of ``fastpath serve args``: models, ports, admin key, and for
    ``--device cuda`` (or ``auto`` finding CUDA) ``--model-config-name=gpu``; logs the device chosen
    and the configuration file each model loads.

    Raises:
        ServerError: a ``--model`` the model repository lacks; an empty ``--host``; a ``--triton-arg`` of a flag
            FastPath sets (:data:`MANAGED_TRITON_FLAGS`); two of the three ports equal; ``--device
            cuda`` where torch sees no CUDA device (the message names what is missing), or none of the
            models has a GPU configuration.
    """
    from fastpath.errors import ServerError
    from fastpath.server.devices import describe_configs, probe_torch_cuda, select_configuration
    from fastpath.server.process import ServerOptions

    available = repository_models(args.model_repository)
    unknown = [name for name in args.model or () if name not in available]
    if unknown:
        raise ServerError(f"--model {', '.join(unknown)}: not in the model repository {args.model_repository}, "
                          f"which holds {', '.join(available)}")
    if not args.host.strip():
        raise ServerError("--host is empty; give the address to bind to (0.0.0.0: every interface; 127.0.0.1: this machine)")
    for flag in args.triton_arg or ():
        name = flag.split("=", 1)[0].split()[0] if flag.strip() else flag
        if name in MANAGED_TRITON_FLAGS:
            raise ServerError(f"--triton-arg={flag}: fastpath serve sets {name} itself ({MANAGED_TRITON_FLAGS[name]}); "
                              "a second value would leave it waiting on the wrong port or mode")
    ports = {"--http-port": args.http_port, "--grpc-port": args.grpc_port, "--metrics-port": args.metrics_port}
    if len(set(ports.values())) < len(ports):
        raise ServerError("HTTP, gRPC and metrics need a port each; got " + ", ".join(f"{k} {v}" for k, v in ports.items()))
    models = tuple(args.model or available)
    device, config_name, why = select_configuration(args.device, args.model_repository, models, probe or probe_torch_cuda)
    LOG.info("device %s (--device %s: %s)", device, args.device, why)
    for line in describe_configs(args.model_repository, models, config_name):
        LOG.info("  %s", line)
    return ServerOptions(
        model_repository=args.model_repository,
        models=models,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        host=args.host,
        log_verbose=args.log_verbose,
        admin_key=admin_key,
        model_config_name=config_name,
        extra_args=tuple(args.triton_arg or ()),
        state_dir=args.state_dir,
        malloc=args.malloc,
    )


RESTART_WINDOW_S = 600.0  # --max-restarts counts the restarts within this window (the stub supervisor's is 10 minutes too)


def restart_allowed(restarts: list[float], now: float, limit: int, window_s: float = RESTART_WINDOW_S) -> bool:
    """Whether a tritonserver that died may be restarted at ``now`` (monotonic seconds): fewer than ``limit``
    restarts in the last ``window_s``. Records the restart in ``restarts`` when it is allowed."""
    restarts[:] = [t for t in restarts if now - t < window_s]
    if len(restarts) >= limit:
        return False
    restarts.append(now)
    return True


def cmd_serve(args: argparse.Namespace) -> int:
    """Run tritonserver until SIGTERM/SIGINT; returns its exit code (1: a refused start, a model that never got
    ready, the stub supervisor's stop, or a server that died more than ``--max-restarts`` times in 10 minutes).

    A tritonserver that dies on its own (a crash in Triton itself: docs/known-issues.md) is restarted on the same
    ports and repository, after its orphaned stubs and shared memory are cleaned up; the serving versions come
    back from their records (docs/design/hot-swap.md)."""
    import time

    from fastpath.errors import ServerError

    stop_requested = threading.Event()

    def _request_stop(signum: int, _frame: object) -> None:
        # Only flag here: waiting on the child inside a handler that interrupted Popen.wait deadlocks.
        LOG.info("received %s: stopping tritonserver", signal.Signals(signum).name)
        stop_requested.set()

    # first: a stop during the checks below (the CUDA probe takes seconds) is a clean exit, not a traceback
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    admin_key, generated = _admin_key()
    try:
        options = serve_options(args, admin_key)
    except ServerError as exc:
        LOG.error("%s", exc)
        return 1
    if stop_requested.is_set():
        LOG.info("stopped before tritonserver started")
        return 0
    restarts: list[float] = []
    published = False

    def _on_ready() -> None:
        nonlocal published
        if generated and not published:
            _publish_admin_key(admin_key, (options.http_port, options.grpc_port))
            published = True
        _log_ready(args, options)

    try:
        while True:
            run = _serve_once(options, args.ready_timeout_s, stop_requested, _on_ready)
            if run.final or run.code == 0:
                return run.code
            if not restart_allowed(restarts, time.monotonic(), args.max_restarts):
                LOG.error("tritonserver died (exit code %s) and has been restarted %d times in the last %.0f s "
                          "(--max-restarts %d): not restarting it", run.code, len(restarts), RESTART_WINDOW_S, args.max_restarts)
                return run.code
            LOG.error("tritonserver died (exit code %s): restarting it (restart %d of at most %d in %.0f s)",
                      run.code, len(restarts), args.max_restarts, RESTART_WINDOW_S)
    finally:
        if published:
            _withdraw_admin_key(admin_key, (options.http_port, options.grpc_port))


@dataclasses.dataclass(frozen=True)
class ServerRun:
    """How one tritonserver ended: its exit ``code`` (1 for a refused start, a model never ready, or the stub
    supervisor's stop), and ``final``: True unless it died on its own, the one ending a restart may follow."""

    code: int
    final: bool


def _serve_once(options: ServerOptions, ready_timeout_s: float, stop_requested: threading.Event,
                on_ready: Callable[[], None]) -> ServerRun:
    """One tritonserver from start to exit: start it, wait until its models are ready (then ``on_ready``),
    supervise its stubs until it exits, a stop is requested or the supervisor gives up, and stop it."""
    from fastpath.errors import ServerError
    from fastpath.server.process import TritonServer

    server = TritonServer(options)
    try:
        server.start()
    except ServerError as exc:
        LOG.error("%s", exc)
        return ServerRun(1, final=True)
    LOG.info("tritonserver pid %s, models %s from %s", server.pid, ", ".join(options.models), options.model_repository)
    try:
        server.wait_ready(timeout_s=ready_timeout_s, cancel=stop_requested)
    except ServerError as exc:
        server.stop()
        LOG.error("%s", exc)
        return ServerRun(1, final=True)
    supervisor = None
    if not stop_requested.is_set():
        on_ready()
        supervisor = stub_supervisor(server)
        supervisor.start()
    while server.poll() is None and not stop_requested.wait(0.5):
        if supervisor is not None and supervisor.failure is not None:
            LOG.error("stopping tritonserver: %s", supervisor.failure)
            break
    if supervisor is not None:
        supervisor.stop()
        supervisor.join(timeout=1.0)  # a reload under way goes on; server.stop() unloads what it loads
    died = server.poll() is not None and not stop_requested.is_set()
    code = server.stop()
    LOG.info("tritonserver exited with code %s", code)
    if supervisor is not None and supervisor.failure is not None:
        return ServerRun(1, final=True)
    return ServerRun(code, final=not died)


def _log_ready(args: argparse.Namespace, options: ServerOptions) -> None:
    LOG.info("ready: HTTP http://%s:%d  gRPC %s:%d  metrics http://%s:%d/metrics",
             args.host, options.http_port, args.host, options.grpc_port, args.host, options.metrics_port)
    if "text_embedding" in options.models:  # application/json: curl -d's default form type crashes Triton 2.51 above ~4 MB
        LOG.info("try: curl -s localhost:%d/v2/models/text_embedding/infer -H 'Content-Type: application/json' -d "
                 "'{\"inputs\":[{\"name\":\"TEXT\",\"shape\":[1,1],\"datatype\":\"BYTES\",\"data\":[\"hello world\"]}]}'",
                 options.http_port)


def stub_supervisor(server: TritonServer) -> StubSupervisor:
    """A :class:`~fastpath.server.stubs.StubSupervisor` of ``server``'s python-backend stubs (not started);
    it records each reload in ``server``'s state directory, where the admin ``status`` reads it."""
    from fastpath.server.process import group_members
    from fastpath.server.stubs import StubSupervisor, list_stubs
    from fastpath.swaps.control import ControlPlane, instance_key

    pid, state = server.pid, server.state_dir

    def journal(model: str, event: dict) -> None:
        if state is not None:  # the FastPath version the instance served, from its last report (None without live swaps)
            plane = ControlPlane(state, model)
            report = plane.last_report(instance_key(event["instance"], event["pid"]))
            plane.note_recovery({**event, "serving_version": report.get("active_version")})

    return StubSupervisor(lambda: list_stubs(group_members(pid)), server.api(), journal=journal)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` command to the ``fastpath`` parser."""
    serve = subparsers.add_parser("serve", help="run tritonserver with FastPath models (Ctrl-C stops it)")
    serve.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY,
                       help=f"the Triton model repository to serve (default: {DEFAULT_REPOSITORY})")
    serve.add_argument("--model", action="append", default=None,
                       help="model to load (repeatable; default: every model of the model repository)")
    serve.add_argument("--http-port", **env_port_option("HTTP_PORT", 8000),
                       help="Triton's HTTP/REST port (default: $HTTP_PORT or 8000)")
    serve.add_argument("--grpc-port", **env_port_option("GRPC_PORT", 8001),
                       help="Triton's gRPC port (default: $GRPC_PORT or 8001)")
    serve.add_argument("--metrics-port", **env_port_option("METRICS_PORT", 8002),
                       help="Prometheus metrics port, /metrics (default: $METRICS_PORT or 8002)")
    serve.add_argument("--host", default="0.0.0.0",
                       help="address HTTP, gRPC and metrics bind to (default 0.0.0.0, Triton's: every interface; "
                            "--host 127.0.0.1 keeps it on this machine)")
    serve.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                       help="cpu (default): every model's config.pbtxt; cuda: each model that has a GPU configuration "
                            "from it (<model>/configs/gpu.pbtxt: text_embedding on torch fp16, text_detection on ONNX "
                            "Runtime's CUDA EP; CUDA graphs, KIND_GPU instances), the others from config.pbtxt; auto: "
                            "cuda when torch sees a CUDA device")
    serve.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose level")
    serve.add_argument("--ready-timeout-s", type=positive_seconds, default=300.0,
                       help="seconds to wait for every model to be ready before giving up (default 300)")
    serve.add_argument("--max-restarts", type=bounded(int, 0, False, "restarts in 10 minutes"), default=3,
                       help="restart a tritonserver that dies on its own at most this many times in 10 minutes, "
                            "then exit with its code (default 3; 0: never, for an orchestrator that restarts)")
    serve.add_argument("--triton-arg", action="append", default=None, metavar="FLAG",
                       help="one more tritonserver flag, passed as given after FastPath's (repeatable), "
                            "e.g. --triton-arg=--metrics-config=summary_latencies=true")
    from fastpath.server.malloc import CHOICES

    serve.add_argument("--malloc", choices=CHOICES, default=os.environ.get("FASTPATH_MALLOC") or "auto",
                       help="tritonserver's malloc (default: $FASTPATH_MALLOC when set and not empty, else auto): "
                            "tcmalloc, preloaded, keeps its memory flat over model reloads (glibc's grows with each); "
                            "auto: tcmalloc where installed (make setup installs it), else glibc with a warning. Its "
                            "python-backend stubs keep glibc's")
    state_dir = os.environ.get("FASTPATH_STATE_DIR")
    serve.add_argument("--state-dir", type=Path, default=Path(state_dir) if state_dir else None,
                       help="control-plane directory of live swaps (default: $FASTPATH_STATE_DIR, else a fresh "
                            "temporary directory per start)")
    serve.set_defaults(func=cmd_serve)
