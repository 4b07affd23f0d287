"""Container entrypoint: replace this process with the image's own ``tritonserver``, started with the
flags ``fastpath serve`` uses.

``fastpath serve`` runs the ``tritonserver`` inside the nvidia-pytriton wheel. In the NGC image the
server lives in ``/opt/tritonserver`` (the same Triton 2.51, plus the TensorRT and other backends), and
``fastpath.server.process`` has no option to point at it (see docs/deployment.md, "Using `fastpath serve` in the
image"). So this script builds the argument list with :func:`fastpath.server.process.server_command` (one source
of truth for the flags: explicit model control, strict readiness, the admin-key restriction of Triton's
model-repository API) and ``exec``s it. Triton then receives SIGTERM from Docker or Kubernetes directly
and runs its graceful shutdown (readiness goes false, in-flight requests drain for up to
``--exit-timeout-secs``, models unload).

Environment (all optional except the key):
    FASTPATH_ADMIN_KEY         required, at least 16 characters: restricts Triton's model-repository API
                               and its log and trace settings (header ``fastpath-admin-key``) and
                               authorizes FastPath swaps.
    FASTPATH_MODEL_REPOSITORY  default /opt/fastpath/model_repository
    FASTPATH_MODELS            comma-separated models to load, default text_embedding,fastpath_admin
    FASTPATH_STATE_DIR         swap control-plane directory, default /var/run/fastpath/state
    FASTPATH_TRITON_DIR        the Triton installation, default /opt/tritonserver
    FASTPATH_TRITON_ARGS       more tritonserver flags (shell syntax), appended last
    FASTPATH_LOG_VERBOSE       tritonserver --log-verbose level, default 0
    HTTP_PORT, GRPC_PORT, METRICS_PORT   default 8000, 8001, 8002
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

MIN_ADMIN_KEY_CHARS = 16
DEFAULT_MODELS = ("text_embedding", "fastpath_admin")
# summary_latencies: per-model latency quantiles (nv_inference_*_summary_us) for the dashboard.
# exit-timeout-secs: how long Triton drains in-flight requests on SIGTERM (Triton's default, made explicit
# because the Kubernetes terminationGracePeriodSeconds is sized from it).
DEFAULT_TRITON_ARGS = ("--metrics-config=summary_latencies=true", "--exit-timeout-secs=30")


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


def triton_command(env: Mapping[str, str]) -> list[str]:
    """The ``tritonserver`` argument list for this container's environment ``env``."""
    from fastpath.server.process import ServerOptions, server_command

    dist = Path(env.get("FASTPATH_TRITON_DIR", "/opt/tritonserver"))
    models = tuple(m.strip() for m in env.get("FASTPATH_MODELS", ",".join(DEFAULT_MODELS)).split(",") if m.strip())
    options = ServerOptions(
        model_repository=Path(env.get("FASTPATH_MODEL_REPOSITORY", "/opt/fastpath/model_repository")),
        models=models,
        http_port=_int(env, "HTTP_PORT", 8000),
        grpc_port=_int(env, "GRPC_PORT", 8001),
        metrics_port=_int(env, "METRICS_PORT", 8002),
        log_verbose=_int(env, "FASTPATH_LOG_VERBOSE", 0),
        admin_key=admin_key(env),
        extra_args=DEFAULT_TRITON_ARGS + tuple(shlex.split(env.get("FASTPATH_TRITON_ARGS", ""))),
    )
    return server_command(options, dist / "backends", dist)


def triton_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus the variables the FastPath stubs read (admin key, control-plane directory)."""
    child = dict(env)
    child["FASTPATH_STATE_DIR"] = env.get("FASTPATH_STATE_DIR", "/var/run/fastpath/state")
    return child


def main() -> None:
    env = dict(os.environ)
    command = triton_command(env)
    child_env = triton_environment(env)
    Path(child_env["FASTPATH_STATE_DIR"]).mkdir(parents=True, exist_ok=True)
    key = admin_key(env)
    print("fastpath entrypoint: exec", shlex.join(a.replace(key, "<admin key>") for a in command), file=sys.stderr, flush=True)
    os.execve(command[0], command, child_env)


if __name__ == "__main__":
    main()
