"""What :meth:`fastpath.server.process.TritonServer.start` checks before tritonserver runs, so that a start that
cannot succeed is refused in one line naming the option: the ports are free and the state directory is usable."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from fastpath.errors import ServerError


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Raise ServerError naming the first of ``ports`` ({"HTTP": 8000, ...}) something already listens on at ``host``,
    or naming ``host`` when it is no address of this machine."""
    for name, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # only a listener blocks, not TIME_WAIT
            try:
                probe.bind((host, port))
            except OSError as exc:
                if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:  # the address, not the port
                    raise ServerError(f"--host {host} is not an address of this machine ({exc.strerror}); give one of "
                                      "its IPv4 addresses, 0.0.0.0 (every interface) or 127.0.0.1 (this machine only)") from exc
                raise ServerError(f"{name} port {port} on {host} is already in use ({exc.strerror}): another server is "
                                  f"running there; stop it or choose other ports (HTTP_PORT, GRPC_PORT, METRICS_PORT)") from exc


def check_state_dir(path: Path) -> None:
    """Make ``path`` (``--state-dir`` / ``FASTPATH_STATE_DIR``) if missing.

    Raises:
        ServerError: it cannot be made (a parent is a file or read-only, it is a file) or is not writable.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServerError(f"state directory {path}: cannot create it ({exc.strerror or exc}); "
                          "expected a writable directory (--state-dir or FASTPATH_STATE_DIR)") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ServerError(f"state directory {path} is not writable by this user; expected a writable directory "
                          "(--state-dir or FASTPATH_STATE_DIR)")
