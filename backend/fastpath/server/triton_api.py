"""The parts of Triton's HTTP API (KServe v2 plus Triton's repository extension) that FastPath's
process management calls: readiness, the repository index, model configs, load and unload.

Plain ``urllib`` (no client library in the server's process); every call sends FastPath's admin
key header when one is set, since ``fastpath serve`` restricts Triton's repository API to it.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ADMIN_HEADER = "fastpath-admin-key"  # the header `fastpath serve` restricts Triton's model-repository API to
ADMIN_KEY_FILE: Path | None = None  # None: ~/.cache/fastpath/admin_key, resolved when asked (a probe may have no home)


def admin_key_file(port: int | str | None = None) -> Path:
    """Where `fastpath serve` writes a generated admin key: one file per port it listens on
    (``admin_key.<port>``, so servers on other ports keep theirs), and ``admin_key`` for the latest.

    Raises:
        RuntimeError: the user has no home directory (``Path.home``).
    """
    latest = ADMIN_KEY_FILE or Path.home() / ".cache" / "fastpath" / "admin_key"
    return latest if port is None else latest.with_name(f"{latest.name}.{port}")


def find_admin_key(port: int | str | None = None) -> str | None:
    """The admin key for the server on ``port``: ``FASTPATH_ADMIN_KEY``, else the file `fastpath serve` wrote for
    that port when it generated the key, else the latest file it wrote; None when there is none of these (or
    no home directory to hold them)."""
    key = os.environ.get("FASTPATH_ADMIN_KEY")
    if key:
        return key
    try:
        paths = ([admin_key_file(port)] if str(port or "").isdigit() else []) + [admin_key_file()]
    except RuntimeError:
        return None
    for path in paths:
        if path.is_file():
            return path.read_text().strip()
    return None


def http_status(request: urllib.request.Request | str, timeout_s: float) -> int:
    """The HTTP status ``request`` (or a GET of a URL) gets: the server's code, error codes included, or 0
    when nothing answered in ``timeout_s``."""
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


class RepositoryApi:
    """The few calls of Triton's HTTP API FastPath's process management needs (the stub supervisor,
    the liveness check, the unload before a stop), with the admin key header when set.

    Args:
        http_url: ``host:port`` of Triton's HTTP endpoint.
        admin_key: FastPath's admin key ('' when the repository API is not restricted).
        header: the header Triton was told to require (:data:`ADMIN_HEADER`, what ``fastpath serve`` sets).
    """

    def __init__(self, http_url: str, admin_key: str = "", header: str = ADMIN_HEADER) -> None:
        self.base = f"http://{http_url}"
        self.headers = {header: admin_key} if admin_key else {}

    @classmethod
    def from_environment(cls, http_port: int) -> RepositoryApi:
        """The Triton on this host's ``http_port`` (probes, hooks), with the admin key :func:`find_admin_key` finds:
        ``FASTPATH_ADMIN_KEY``, else the key file `fastpath serve` wrote for that port."""
        return cls(f"127.0.0.1:{http_port}", find_admin_key(http_port) or "")

    def _call(self, method: str, path: str, timeout_s: float) -> int:
        request = urllib.request.Request(self.base + path, method=method, headers=self.headers, data=b"" if method == "POST" else None)
        return http_status(request, timeout_s)

    def _json(self, method: str, path: str, timeout_s: float = 5.0) -> object:
        request = urllib.request.Request(self.base + path, method=method, headers=self.headers, data=b"{}" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return json.loads(reply.read())

    def index(self) -> list[dict]:
        """Triton's repository index (POST /v2/repository/index): name, version, state, reason per entry.

        Raises:
            OSError: Triton did not answer, or refused the admin key (urllib's HTTPError).
        """
        return self._json("POST", "/v2/repository/index")  # type: ignore[return-value]

    def ready_models(self) -> list[tuple[str, str]]:
        """(model, version) of every model version Triton reports READY (POST /v2/repository/index).

        Raises:
            OSError: Triton did not answer (urllib's URLError and HTTPError are OSErrors).
        """
        return [(entry["name"], str(entry.get("version", ""))) for entry in self.index() if entry.get("state") == "READY"]

    def config(self, model: str, version: str) -> dict:
        """The model version's configuration as Triton has it (GET .../config), JSON."""
        return self._json("GET", f"/v2/models/{model}/versions/{version}/config")  # type: ignore[return-value]

    def is_ready(self, model: str, version: str, timeout_s: float = 10.0) -> bool:
        """Whether Triton has ``model`` version ``version`` ready (GET .../versions/<version>/ready); asked only
        when a stub is gone or stalled, so a slow answer is waited for rather than missed.

        Raises:
            TimeoutError: no answer within ``timeout_s`` (a loaded server can be slow; a refused connection counts
                too): no answer is not "not ready", so the caller asks again rather than acting on it.
        """
        status = self._call("GET", f"/v2/models/{model}/versions/{version}/ready", timeout_s)
        if status == 0:
            raise TimeoutError(f"Triton at {self.base} gave no answer within {timeout_s:.0f} s to whether model '{model}' "
                               f"version {version} is ready")
        return status == 200

    def reload(self, model: str, unload_timeout_s: float = 60.0, load_timeout_s: float = 600.0) -> bool:
        """Unload ``model``, wait until Triton no longer has it ready, load it; True if the load succeeded."""
        if self._call("POST", f"/v2/repository/models/{model}/unload", 30.0) != 200:
            return False
        deadline = time.monotonic() + unload_timeout_s
        # until Triton says the model is no longer ready: no answer (0) is no such word
        while self._call("GET", f"/v2/models/{model}/ready", 2.0) in (0, 200) and time.monotonic() < deadline:
            time.sleep(0.2)
        return self._call("POST", f"/v2/repository/models/{model}/load", load_timeout_s) == 200

    def unload_all(self, timeout_s: float = 60.0) -> list[str]:
        """Unload every model Triton has ready and wait until none is ready or unloading.

        Triton finishes a model's in-flight requests before it finalizes the model's instances, and
        FastPath's ``finalize`` drains its scheduler, so every accepted request is answered. Used
        before stopping tritonserver: Triton 2.51's own shutdown first waits for open HTTP
        connections for the whole exit timeout (server PR 6986), and an idle keep-alive client would leave
        the models no time to drain.

        Returns:
            The models asked to unload (empty when Triton did not answer).
        """
        deadline = time.monotonic() + timeout_s
        asked: dict[str, float] = {}  # model -> when its unload was last asked for
        while time.monotonic() < deadline:
            try:
                index = self._json("POST", "/v2/repository/index")
            except OSError:
                break
            states = [(entry.get("name", ""), entry.get("state")) for entry in index]  # type: ignore[union-attr]
            for model in sorted({name for name, state in states if state == "READY"}):
                if time.monotonic() - asked.get(model, -1e9) > 2.0:  # again if it came back (a reload that was under way)
                    asked[model] = time.monotonic()
                    self._call("POST", f"/v2/repository/models/{model}/unload", max(1.0, deadline - time.monotonic()))
            if not any(state in ("READY", "UNLOADING", "LOADING") for _, state in states):
                break
            time.sleep(0.1)
        return sorted(asked)


def unreachable(port: int, exc: OSError) -> str:
    """The line a probe prints when Triton's API failed: a refused admin key says so (HTTP 401/403)."""
    if isinstance(exc, urllib.error.HTTPError) and exc.code in (401, 403):
        return (f"Triton on port {port} refused the admin key (HTTP {exc.code}): set FASTPATH_ADMIN_KEY to the "
                "server's key (the repository API is restricted to it)")
    return f"Triton on port {port} did not answer: {exc}"


def add_http_port(parser: Any) -> None:
    """``--http-port`` for the probes and hooks run beside a server: default ``$HTTP_PORT`` (the variable
    `make serve` and `fastpath serve` read), else Triton's 8000; a ``$HTTP_PORT`` that is no number is a usage error."""
    import argparse

    from fastpath.cli.common import port_number  # stdlib only: no cycle

    text = os.environ.get("HTTP_PORT", "").strip()
    try:
        default = port_number(text) if text else 8000
    except argparse.ArgumentTypeError:
        parser.error(f"HTTP_PORT={text!r} is not a port number (1-65535)")
    parser.add_argument("--http-port", type=port_number, default=default,
                        help="Triton's HTTP port (default: $HTTP_PORT, the variable make serve reads, else 8000)")


def main(argv: list[str] | None = None) -> int:
    """``python -m fastpath.server.triton_api --unload-all``: unload every model of the Triton on
    ``--http-port`` and wait until none is loaded (a Kubernetes ``preStop`` hook: the models drain
    before the kubelet's SIGTERM, whatever connections clients keep open). The admin key comes from
    ``FASTPATH_ADMIN_KEY``, else from the file `fastpath serve` wrote for the port (:func:`find_admin_key`).
    Exit 0 when nothing is left loaded, 1 otherwise."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m fastpath.server.triton_api", description=main.__doc__)
    parser.add_argument("--unload-all", action="store_true", required=True)
    add_http_port(parser)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    api = RepositoryApi.from_environment(args.http_port)
    models = api.unload_all(args.timeout_s)
    try:
        left = api.ready_models()
    except OSError as exc:
        print(unreachable(args.http_port, exc), file=sys.stderr)
        return 1
    print(f"unloaded: {', '.join(models) or 'nothing'}" + (f"; still ready: {left}" if left else ""))
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
