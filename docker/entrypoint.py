"""Container entrypoint (both images): check the environment, then run ``fastpath serve`` in this process.

``fastpath serve`` starts ``tritonserver`` as its child with FastPath's flags (explicit model control,
strict readiness, the admin-key restriction of Triton's model-repository API), supervises the
python-backend stubs (reloads a model whose stub died, exits 1 when that keeps happening) and, on
SIGTERM from Docker or Kubernetes (forwarded by tini), first unloads every model, so that Triton
finishes the in-flight requests and FastPath drains its queue, then stops Triton and exits 0
(docs/deployment.md, "Running `fastpath serve`"). Triton signalled directly would not: Triton 2.51
first waits its whole exit timeout for open HTTP connections (one keep-alive client is enough), then
gives the models no time left and exits 1 ("Exit timeout expired").

Which Triton: ``FASTPATH_TRITON_DIR`` when set, else ``/opt/tritonserver`` when it holds
``bin/tritonserver`` (the NGC GPU image: Triton 2.51 with the TensorRT and other backends), else the
``tritonserver`` inside the nvidia-pytriton wheel (the CPU image), the one ``make serve`` runs.

Environment (all optional except the key):
    FASTPATH_ADMIN_KEY         required, at least 16 characters: restricts Triton's model-repository API
                               and its log and trace settings (header ``fastpath-admin-key``) and
                               authorizes FastPath swaps.
    FASTPATH_MODEL_REPOSITORY  default /opt/fastpath/model_repository
    FASTPATH_MODELS            comma-separated models to load, default every model of the repository
                               (as ``fastpath serve``)
    FASTPATH_STATE_DIR         swap control-plane directory, default /var/run/fastpath/state
    FASTPATH_VERSION_STATE_DIR serving-version records of live swaps (fastpath.swaps.record), default
                               /var/run/fastpath/versions; empty: beside each model's config.pbtxt
    FASTPATH_TRITON_DIR        the Triton installation (above)
    FASTPATH_TRITON_ARGS       more tritonserver flags (shell syntax), appended last
    FASTPATH_LOG_VERBOSE       tritonserver --log-verbose level, default 0
    FASTPATH_MALLOC            tritonserver's malloc (``fastpath serve --malloc``), default auto: the image's tcmalloc
    HTTP_PORT, GRPC_PORT, METRICS_PORT   default 8000, 8001, 8002
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from fastpath.cli.common import MIN_ADMIN_KEY_CHARS

NGC_TRITON_DIR = Path("/opt/tritonserver")
# summary_latencies: per-model latency quantiles (nv_inference_*_summary_us) for the dashboard.
# exit-timeout-secs: how long Triton drains in-flight requests when stopped (Triton's default, made explicit
# because the Kubernetes terminationGracePeriodSeconds is sized from it).
DEFAULT_TRITON_ARGS = ("--metrics-config=summary_latencies=true", "--exit-timeout-secs=30")
# The directories the server writes, with the images' defaults: the live-swap control plane, and the record
# of each model's serving version, which a reload or a restart comes back on.
STATE_DIRS = {"FASTPATH_STATE_DIR": "/var/run/fastpath/state", "FASTPATH_VERSION_STATE_DIR": "/var/run/fastpath/versions"}


class EntrypointError(SystemExit):
    """The container environment is unusable; the message says which variable and what to set."""


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise EntrypointError(f"environment variable {name}={value!r} is not an integer") from None


def admin_key(env: Mapping[str, str]) -> str:
    """FASTPATH_ADMIN_KEY, refused when missing or shorter than MIN_ADMIN_KEY_CHARS.

    Without a key, Triton's model-repository API (load/unload any model) would be open to every client
    that reaches port 8000/8001, and FastPath swaps would be disabled.

    Raises:
        EntrypointError: the key is missing or too short.
    """
    key = env.get("FASTPATH_ADMIN_KEY", "")
    if len(key) < MIN_ADMIN_KEY_CHARS:
        got = "not set" if not key else f"{len(key)} characters"
        raise EntrypointError(
            f"FASTPATH_ADMIN_KEY is {got}; set it to at least {MIN_ADMIN_KEY_CHARS} characters "
            "(e.g. `openssl rand -base64 32`; in Kubernetes from the Secret fastpath-admin)"
        )
    return key


def serve_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the defaults of the image: the state directories, and ``FASTPATH_TRITON_DIR`` pointing at
    ``/opt/tritonserver`` where that exists (else ``fastpath serve`` finds the wheel's Triton)."""
    child = dict(env)
    for name, default in STATE_DIRS.items():
        child.setdefault(name, default)
    if not child.get("FASTPATH_TRITON_DIR") and (NGC_TRITON_DIR / "bin" / "tritonserver").is_file():
        child["FASTPATH_TRITON_DIR"] = str(NGC_TRITON_DIR)
    return child


def check_state_dirs(env: Mapping[str, str]) -> list[Path]:
    """Create the :data:`STATE_DIRS` of ``env`` (an empty ``FASTPATH_VERSION_STATE_DIR`` is none) if needed
    and refuse to start when this user cannot write one (with ``docker run --read-only`` they must be on a
    tmpfs or volume this user owns). Without a writable record directory every swap would be refused.

    Raises:
        EntrypointError: a directory cannot be created or written.
    """
    checked = []
    for name, default in STATE_DIRS.items():
        value = env.get(name, default)
        if not value:
            continue
        state = Path(value)
        try:
            state.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EntrypointError(f"{name} {state} cannot be created ({exc.strerror}); on a read-only root file system "
                                  f"mount a tmpfs or volume the server's user owns, e.g. --tmpfs {state.parent}:"
                                  f"uid={os.getuid()},gid={os.getgid()}") from None
        if not os.access(state, os.W_OK):
            raise EntrypointError(f"{name} {state} is not writable by uid {os.getuid()}")
        checked.append(state)
    return checked


def serve_arguments(env: Mapping[str, str]) -> list[str]:
    """The ``fastpath serve`` arguments for this container's environment ``env`` (key checked first)."""
    admin_key(env)
    arguments = [
        "serve",
        f"--model-repository={env.get('FASTPATH_MODEL_REPOSITORY', '/opt/fastpath/model_repository')}",
        f"--http-port={_int(env, 'HTTP_PORT', 8000)}",
        f"--grpc-port={_int(env, 'GRPC_PORT', 8001)}",
        f"--metrics-port={_int(env, 'METRICS_PORT', 8002)}",
        f"--log-verbose={_int(env, 'FASTPATH_LOG_VERBOSE', 0)}",
        f"--state-dir={env.get('FASTPATH_STATE_DIR', '/var/run/fastpath/state')}",
    ]
    arguments += [f"--model={m.strip()}" for m in env.get("FASTPATH_MODELS", "").split(",") if m.strip()]
    arguments += [f"--triton-arg={a}" for a in DEFAULT_TRITON_ARGS + tuple(shlex.split(env.get("FASTPATH_TRITON_ARGS", "")))]
    return arguments


def triton_command(env: Mapping[str, str]) -> list[str]:
    """The ``tritonserver`` command line ``fastpath serve`` runs in environment ``env`` (for checks; the
    stub is not copied)."""
    from fastpath.cli.main import build_parser
    from fastpath.cli.serve import serve_options
    from fastpath.server.process import server_command, triton_dist_dir

    child = serve_environment(env)
    options = serve_options(build_parser().parse_args(serve_arguments(child)), admin_key(child))
    dist = triton_dist_dir(child)
    return server_command(options, dist / "backends", dist)


def main() -> int:
    env = serve_environment(os.environ)
    arguments = serve_arguments(env)
    check_state_dirs(env)
    os.environ.update(env)
    key = env["FASTPATH_ADMIN_KEY"]
    print("fastpath entrypoint: fastpath", shlex.join(a.replace(key, "<admin key>") for a in arguments), file=sys.stderr, flush=True)
    from fastpath.cli.main import main as fastpath_main

    return fastpath_main(arguments)


if __name__ == "__main__":
    sys.exit(main())
