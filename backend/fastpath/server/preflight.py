"""What :meth:`fastpath.server.process.TritonServer.start` checks before tritonserver runs, so that a start that
cannot succeed is refused in one line naming the option: the ports are free, the state directory is usable, and
no model directory holds a dangling symbolic link (Triton's poll of a model directory fails on one)."""

from __future__ import annotations

import errno
import logging
import os
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

from fastpath.errors import ServerError
from fastpath.swaps.record import RECORD_NAME, STATE_DIR_ENV

LOG = logging.getLogger("fastpath")


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


def check_state_dir(path: Path, *, what: str = "state directory", option: str = "--state-dir or FASTPATH_STATE_DIR") -> None:
    """Make ``path`` (``--state-dir`` / ``FASTPATH_STATE_DIR``, or the directory ``option`` names) if missing.

    Raises:
        ServerError: it cannot be made (a parent is a file or read-only, it is a file) or is not writable,
            naming ``what`` it is and the ``option`` that set it.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServerError(f"{what} {path}: cannot create it ({exc.strerror or exc}); "
                          f"expected a writable directory ({option})") from None
    try:  # a real write: os.access says yes to root on read-only file systems such as /sys
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise ServerError(f"{what} {path} is not writable by this user ({exc.strerror or exc}); expected a writable "
                          f"directory ({option})") from None


def check_version_state_dir(path: Path | None) -> None:
    """Make the serving-version record directory (``FASTPATH_VERSION_STATE_DIR``; None or empty: each model's own
    directory, not checked) if missing. Every live swap writes its record there first, so a directory that cannot
    be written would refuse every swap, found only at the first one.

    Raises:
        ServerError: it cannot be made or is not writable.
    """
    if path is not None and str(path):
        check_state_dir(path, what="serving-version record directory", option=f"{STATE_DIR_ENV}")


def check_model_dirs(repository: Path, models: Iterable[str]) -> list[Path]:
    """Remove or refuse the dangling symbolic links at the top of each loaded model's directory.

    Triton stats every entry of a model directory when it polls it, and a link to nothing fails that poll
    ("failed to stat file"): the model does not load and the server does not start. A dangling link where
    FastPath keeps the serving-version record (``serving_version.json``) is a damaged record, which must
    never stop the server: the link is removed (it points nowhere, so nothing is lost) and the model starts
    on its loaded version. Any other dangling link is the operator's file: it is refused, named.

    Returns:
        the links removed.

    Raises:
        ServerError: a model directory holds another dangling link.
    """
    removed = []
    for model in models:
        directory = repository / model
        try:
            entries = list(directory.iterdir())
        except OSError:  # a missing model is Triton's to report, with its own message
            continue
        for entry in entries:
            if not entry.is_symlink() or entry.exists():
                continue
            target = os.readlink(entry)
            if entry.name == RECORD_NAME:
                entry.unlink()
                LOG.warning("removed %s: a symbolic link to %s, which does not exist (a damaged serving-version record; "
                            "%s starts on its loaded version)", entry, target, model)
                removed.append(entry)
            else:
                raise ServerError(f"model directory {directory}: {entry.name} is a symbolic link to {target}, "
                                  "which does not exist; Triton cannot poll a model directory holding it: remove the "
                                  "link or point it at a file")
    return removed
