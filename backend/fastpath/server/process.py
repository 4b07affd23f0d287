"""Start, watch and stop the real ``tritonserver`` binary that ships in the ``nvidia-pytriton`` wheel.

Follows PyTriton's ``server/triton_server.py``: the python-backend stub matching this interpreter's
minor version is copied into ``backends/python/``; ``nvidia_pytriton.libs`` goes on
``LD_LIBRARY_PATH``; the child gets ``PR_SET_PDEATHSIG`` so it dies with its parent; stopping sends
SIGINT (Triton's graceful shutdown) and kills after a timeout.

The stub embeds the system ``libpython3.X.so`` and finds packages through the first ``python3`` on
``PATH``, so this interpreter's ``bin/`` goes first on the child's PATH.

``FASTPATH_TRITON_DIR`` may instead name an installation with Triton's own layout (``bin/``,
``backends/python/`` with the stub for this Python already in place), e.g. ``/opt/tritonserver`` of
NVIDIA's NGC image, whose stub the image's Dockerfile replaces with the wheel's 3.11 stub.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import filecmp
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from fastpath.errors import ServerError
from fastpath.server.cleanup import (  # noqa: F401
    SHM_GLOB,
    clean_after_killed_servers,
    group_members,
    make_state_dir,
    mapped_regions,
    reap_process_group,
)
from fastpath.server.malloc import malloc_environment
from fastpath.server.preflight import check_model_dirs, check_ports_free, check_state_dir, check_version_state_dir
from fastpath.server.triton_api import ADMIN_HEADER, RepositoryApi
from fastpath.swaps.record import STATE_DIR_ENV

LOG = logging.getLogger("fastpath.server.process")

GRACEFUL_STOP_S = 30.0
IDLE_EXIT_S = 5.0  # after every model is unloaded: how long tritonserver may wait for idle HTTP connections
# glibc (2.35+) backs its mmap'd chunks and heap with transparent huge pages where the kernel allows them
# (madvise mode): memory a model frees after a large call and needs again for the next one costs 512x fewer
# page faults (text_detection's 8 x 1408x1408 call: 567k faults, 4.2 s of system time -> 2.6k, 1.6 s;
# docs/design/text_detection.md, "Memory"). Ignored by older glibc and other C libraries.
GLIBC_TUNABLES = "glibc.malloc.hugetlb=1"


def triton_dist_dir(env: Mapping[str, str] | None = None) -> Path:
    """``pytriton/tritonserver`` inside the installed nvidia-pytriton wheel, or ``FASTPATH_TRITON_DIR`` of
    ``env`` (default: this process's environment): a directory with the same layout (``bin/``,
    ``backends/``, ``caches/``, ``python_backend_stubs/``, and ``nvidia_pytriton.libs`` two levels up),
    e.g. an unpacked copy on a GPU machine, or Triton's own (module docstring)."""
    import importlib.util

    explicit = (os.environ if env is None else env).get("FASTPATH_TRITON_DIR")
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise ServerError("the nvidia-pytriton wheel is not installed; run 'make serve' or pip install nvidia-pytriton==0.7.0")
    return Path(spec.origin).parent / "tritonserver"


def prepare_backends(dist: Path) -> Path:
    """Put the stub for this Python into ``backends/python``; return the backend directory.

    The copy happens only when the stub there differs, so a read-only installation whose stub was put in
    place beforehand (the CPU container image, at build time) works. An installation without the wheel's
    ``python_backend_stubs/`` (NGC's ``/opt/tritonserver``) must already have its stub in ``backends/python``.

    Raises:
        ServerError: no stub for this Python minor version, or the system libpython is missing.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    target = dist / "backends" / "python" / "triton_python_backend_stub"
    if not (dist / "python_backend_stubs").is_dir() and target.is_file():
        pass  # Triton's own layout: the installation's stub is used as it is
    elif not stub.is_file():
        raise ServerError(f"no python-backend stub for Python {version} in {dist}; use Python 3.8-3.13")
    elif not target.exists() or not filecmp.cmp(stub, target, shallow=False):
        shutil.copy2(stub, target)
    if ctypes.util.find_library(f"python{version}") is None:
        raise ServerError(
            f"the python-backend stub needs the system libpython{version}.so (Debian: apt-get install libpython{version})"
        )
    return dist / "backends"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    # Its own process group, which its python-backend stubs inherit: if tritonserver dies without
    # stopping them (a crash), they are orphaned but still in this group, and stop() kills the group.
    # A terminal's Ctrl-C reaches only `fastpath serve`, which stops Triton with one SIGINT.
    os.setpgid(0, 0)


# Triton API groups (``--http-restricted-api`` / ``--grpc-restricted-protocol`` names) that need the admin key
# when one is set: load/unload, and the log and trace settings, which any client could otherwise change
# (``POST /v2/logging {"log_verbose_level": 1}`` is accepted without a key unless "logging" is restricted).
RESTRICTED_APIS = ("model-repository", "logging", "trace")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """Where and how tritonserver listens and what it loads.

    Attributes:
        model_repository: the model repository directory.
        models: models loaded at start (explicit model-control mode).
        http_port, grpc_port, metrics_port: TCP ports (Triton defaults 8000/8001/8002).
        host: address HTTP and gRPC bind to.
        log_verbose, extra_args: Triton's ``--log-verbose`` level; more tritonserver flags, passed as given.
        admin_key: FastPath's admin key, passed to the stubs as ``FASTPATH_ADMIN_KEY`` (swap/rollback need it);
            when set, Triton's :data:`RESTRICTED_APIS` answer only clients sending ``fastpath-admin-key: <key>``
            (docs/design/hot-swap.md).
        state_dir: control-plane directory for live swaps (``FASTPATH_STATE_DIR``); None: a fresh one per start.
        version_state_dir: where the serving-version records live (``FASTPATH_VERSION_STATE_DIR``,
            :mod:`fastpath.swaps.record`); None keeps the environment's value, or each model's own directory.
        exit_timeout_s: Triton's ``--exit-timeout-secs``: how long shutdown waits for in-flight requests and
            open HTTP connections (docs/known-issues.md#shutdown).
        model_config_name: Triton's ``--model-config-name``: ``<model>/configs/<name>.pbtxt`` where a model has
            one, else ``config.pbtxt``; "" loads ``config.pbtxt`` everywhere (:mod:`fastpath.server.devices`).
        malloc: tritonserver's malloc, one of :data:`fastpath.server.malloc.CHOICES` (:mod:`fastpath.server.malloc`).
    """

    model_repository: Path
    models: tuple[str, ...] = ("text_embedding", "fastpath_admin")
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "0.0.0.0"
    log_verbose: int = 0
    extra_args: tuple[str, ...] = ()
    admin_key: str = ""
    state_dir: Path | None = None
    version_state_dir: Path | None = None
    exit_timeout_s: int = 30
    model_config_name: str = ""
    malloc: str = "auto"


def server_command(options: ServerOptions, backends: Path, dist: Path) -> list[str]:
    """The ``tritonserver`` argument list for ``options``."""
    command = [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={options.model_repository.resolve()}",
        f"--backend-directory={backends}",
        f"--cache-directory={dist / 'caches'}",
        "--model-control-mode=explicit",
        f"--http-address={options.host}",
        f"--grpc-address={options.host}",
        f"--http-port={options.http_port}",
        f"--grpc-port={options.grpc_port}",
        f"--metrics-port={options.metrics_port}",
        "--allow-metrics=true",
        f"--log-verbose={options.log_verbose}",
        "--exit-on-error=true",
        "--strict-readiness=true",
        f"--exit-timeout-secs={options.exit_timeout_s}",
    ]
    if options.model_config_name:
        command.append(f"--model-config-name={options.model_config_name}")
    command += [f"--load-model={name}" for name in options.models]
    if options.admin_key:
        restriction = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={options.admin_key}"
        command += [f"--http-restricted-api={restriction}", f"--grpc-restricted-protocol={restriction}"]
    return command + list(options.extra_args)


def server_environment(dist: Path, *, admin_key: str = "", state_dir: Path | None = None,
                       version_state_dir: Path | None = None) -> dict[str, str]:
    """The child's environment: this interpreter's ``bin/`` first on PATH, Triton's libs on
    LD_LIBRARY_PATH, FastPath's admin key, control-plane and version-record directories for the stubs, and
    ``GLIBC_TUNABLES`` (:data:`GLIBC_TUNABLES`) unless the environment sets it."""
    env = dict(os.environ)
    env.setdefault("GLIBC_TUNABLES", GLIBC_TUNABLES)
    env["FASTPATH_ADMIN_KEY"] = admin_key
    if state_dir is not None:
        env["FASTPATH_STATE_DIR"] = str(state_dir)
    if version_state_dir is not None:
        env["FASTPATH_VERSION_STATE_DIR"] = str(version_state_dir)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    libs = dist.parent.parent / "nvidia_pytriton.libs"  # the wheel's layout; absent in Triton's own
    if libs.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


class TritonServer:
    """A running ``tritonserver`` child process.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. ``stop`` is idempotent.

    Args:
        options: ports, repository and models.
        log_path: file for Triton's stdout/stderr; ``None`` inherits this process's streams.
    """

    def __init__(self, options: ServerOptions, *, log_path: Path | None = None) -> None:
        self.options = options
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file = None
        self.state_dir: Path | None = None
        self._own_state_dir = False

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.options.grpc_port}"

    def start(self) -> TritonServer:
        """Start tritonserver.

        Raises:
            ServerError: one of its ports is already taken (checked first: otherwise a second server
                on the same ports would load its models while the first one answered the readiness
                probe, and look ready until it failed to bind); ``options.state_dir`` or the serving-version
                record directory (``FASTPATH_VERSION_STATE_DIR``) cannot be made or written, or a model directory holds a dangling symbolic link other than its serving-version
                record, which is removed (:mod:`fastpath.server.preflight`); or ``options.malloc`` cannot be had
                (:func:`fastpath.server.malloc.malloc_environment`).
        """
        check_ports_free(self.options.host, {"HTTP": self.options.http_port, "gRPC": self.options.grpc_port,
                                             "metrics": self.options.metrics_port})
        check_model_dirs(self.options.model_repository, self.options.models)
        dist = triton_dist_dir()
        command = server_command(self.options, prepare_backends(dist), dist)
        self.state_dir = self.options.state_dir
        if self.state_dir is None:
            self.state_dir, self._own_state_dir = make_state_dir(), True
        else:
            check_state_dir(self.state_dir)
        try:
            records = self.options.version_state_dir or os.environ.get(STATE_DIR_ENV) or None  # None: in the repository
            check_version_state_dir(Path(records) if records else None)
            env = malloc_environment(server_environment(dist, admin_key=self.options.admin_key, state_dir=self.state_dir,
                                                        version_state_dir=self.options.version_state_dir),
                                     self.options.malloc, self.state_dir)
        except BaseException:  # a refused start leaves no state directory behind
            self._drop_state_dir()
            raise
        if self.log_path is not None:
            self._log_file = open(self.log_path, "ab")
        clean_after_killed_servers()
        self._shm_before = {str(p) for p in Path("/dev/shm").glob(SHM_GLOB)} if Path("/dev/shm").is_dir() else set()
        self._process = subprocess.Popen(
            command,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT if self._log_file else None,
            preexec_fn=_die_with_parent,
        )
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def poll(self) -> int | None:
        """Exit code if the process has exited, else None."""
        return self._process.poll() if self._process else None

    def is_ready(self, models: Sequence[str] | None = None) -> bool:
        """True when the server and ``models`` (default: the loaded ones) answer ready over HTTP."""
        paths = ["/v2/health/ready"] + [f"/v2/models/{m}/ready" for m in (models if models is not None else self.options.models)]
        for path in paths:
            try:
                with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=2) as reply:
                    if reply.status != 200:
                        return False
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False
        return True

    def wait_ready(self, timeout_s: float = 120.0, poll_s: float = 0.1, cancel: threading.Event | None = None) -> None:
        """Block until ready, or until ``cancel`` is set (then return at once).

        Raises:
            ServerError: the process exited, or ``timeout_s`` passed (the log path is named).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                return
            code = self.poll()
            if code is not None:
                raise ServerError(f"tritonserver exited with code {code} before becoming ready; see {self._output_hint()}")
            if self.is_ready():
                return
            time.sleep(poll_s)
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s; see {self._output_hint()}")

    def _output_hint(self) -> str:
        """Where Triton said why: its log file, or the output above (its lines starting with E name each
        model that failed to load and the reason, and 'error: creating server' repeats the first)."""
        if self.log_path:
            return str(self.log_path)
        return "tritonserver's output above: its E lines name each model that failed to load and why"

    def wait(self) -> int:
        """Block until the process exits; return its exit code."""
        return self._process.wait() if self._process else 0

    def stop(self, timeout_s: float = GRACEFUL_STOP_S) -> int | None:
        """Unload every model through the repository API (Triton finishes their in-flight requests,
        FastPath's ``finalize`` drains its queue), then SIGINT, then SIGKILL if tritonserver has not
        exited ``IDLE_EXIT_S`` later (models unloaded) or ``timeout_s`` later (they could not be).

        Why unload first: on SIGINT Triton 2.51 first waits for open HTTP connections to close, for
        the whole exit timeout (server PR 6986), before it stops the models with what is left of it.
        One idle keep-alive client would make every stop take 30 s and end in a SIGKILL with the
        models never drained. With the models already unloaded nothing is
        lost when Triton is then stopped while it waits for idle connections.

        Returns:
            tritonserver's exit code; 0 when it was killed only while waiting for idle connections
            after every model had been unloaded, or died of the SIGINT while its models loaded; None if it
            was not running.
        """
        process, self._process = self._process, None
        code = None
        if process is not None:
            owned: set[str] = set()
            if process.poll() is None:
                owned = mapped_regions(group_members(process.pid))  # tritonserver and its stubs: what reap may remove
                deadline = time.monotonic() + timeout_s
                unloaded = self._unload_models(timeout_s)
                process.send_signal(signal.SIGINT)
                wait_s = IDLE_EXIT_S if unloaded else deadline - time.monotonic()
                try:
                    process.wait(max(wait_s, 1.0))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    if unloaded:
                        LOG.info("every model was unloaded and tritonserver had not exited %.0f s after SIGINT (Triton 2.51 "
                                 "waits for open HTTP connections, e.g. idle keep-alive clients, and after a failed load "
                                 "for a model it still counts as live): stopped it", IDLE_EXIT_S)
                        process.returncode = 0
            code = process.returncode
            # Triton installs its SIGINT handler once its models have loaded: stopped before, it dies of the signal,
            # leaving the stubs it was starting (a clean stop: their cleanup is expected, not a warning)
            loading, code = code == -signal.SIGINT, 0 if code == -signal.SIGINT else code
            killed, removed = reap_process_group(process.pid, getattr(self, "_shm_before", set()), owned)
            if loading or killed or removed:
                LOG.log(logging.INFO if loading else logging.WARNING, "tritonserver %s with code %s and left %d processes (killed) "
                        "and %d shared-memory regions (removed: %s)", "was stopped while it loaded its models: exited" if loading
                        else "exited", code, killed, len(removed), ", ".join(Path(r).name for r in removed) or "none")
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._drop_state_dir()
        return code

    def _drop_state_dir(self) -> None:
        """Remove the state directory this server made for itself (one the options named stays)."""
        if self._own_state_dir and self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self._own_state_dir = False

    def api(self) -> RepositoryApi:
        """Triton's HTTP API of this server (readiness, repository index, load/unload), with its admin key."""
        return RepositoryApi(self.http_url, self.options.admin_key)

    def _unload_models(self, timeout_s: float) -> bool:
        """Unload every loaded model; True if Triton answered and none is left loaded."""
        api = self.api()
        models = api.unload_all(timeout_s)
        try:
            left = sorted({entry["name"] for entry in api.index() if entry.get("state") in ("READY", "UNLOADING", "LOADING")})
        except OSError:
            return False
        if models:
            LOG.info("unloaded %s before stopping tritonserver%s", ", ".join(m for m in models if m not in left),
                     f"; not unloaded: {', '.join(left)}" if left else "")
        return bool(models) and not left

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
