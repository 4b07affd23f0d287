"""What the ``fastpath`` commands share: default paths and ports, the admin-key files, one-line errors."""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_REPOSITORY = REPO_ROOT / "model_repository"

_ROLE = re.compile(r":\w+:`~?([^`]+)`")  # :func:`~fastpath.cli.common.default_url` -> default_url


def plain_help(docstring: str | None) -> str:
    """A module docstring as ``--help`` text: reST roles and double backquotes dropped (``x`` -> x)."""
    text = _ROLE.sub(lambda match: match.group(1).rsplit(".", 1)[-1], docstring or "")
    return text.replace("``", "")


def env_int(name: str, default: int) -> int:
    """The port number in environment variable ``name``, else ``default``; exits naming the variable when it is not
    one (an integer in 1-65535)."""
    value = os.environ.get(name, "")
    try:
        return port_number(value) if value else default
    except argparse.ArgumentTypeError:
        raise SystemExit(f"environment variable {name}={value!r} is not a port number (1-65535)") from None


def env_port_option(name: str, default: int) -> dict:
    """``type`` and ``default`` of a port option whose default is environment variable ``name`` (else ``default``):
    the default stays text that argparse converts only when the option is not given, so a bad variable stops only a
    command that uses the port, an explicit option wins over it, and the error names the variable."""

    def port(text: str) -> int:
        try:
            return port_number(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (from environment variable {name})" if text == os.environ.get(name) else str(exc)) from None

    return {"type": port, "default": os.environ.get(name) or str(default)}


def port_number(text: str) -> int:
    """argparse type of a TCP port: an integer in 1-65535.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse prints it with the option's name and exits 2).
    """
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (an integer in 1-65535)")
    return port


def bounded_number(text: str, kind: type, lowest: float, strict: bool, what: str) -> Any:
    """``text`` as a ``kind`` number >= ``lowest`` (> when ``strict``), finite.

    Raises:
        argparse.ArgumentTypeError: anything else, naming ``what`` is expected.
    """
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value) or value < lowest or (strict and value == lowest):
        raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {lowest:g} ({what}), got {text.strip()!r}")
    return value


def bounded(kind: type, lowest: float, strict: bool, what: str) -> Any:
    """An argparse type: a ``kind`` number above ``lowest`` (or equal, when not ``strict``); argparse names
    the option in front of the message ("argument --duration-s: must be > 0 (seconds), got '0'")."""
    return functools.partial(bounded_number, kind=kind, lowest=lowest, strict=strict, what=what)


def positive_seconds(text: str) -> float:
    """argparse type of a duration: a number of seconds > 0.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return seconds


# the shortest FASTPATH_ADMIN_KEY the container entrypoint accepts and `fastpath serve` takes without a warning
# (a generated key has 32 characters)
MIN_ADMIN_KEY_CHARS = 16


PROTOCOL_NAMES = {"http": "HTTP", "grpc": "gRPC"}


def default_port(protocol: str) -> int:
    """Triton's default port for ``protocol`` ("http" | "grpc"): fastpath_client's table."""
    from fastpath_client.errors import DEFAULT_PORTS

    return DEFAULT_PORTS[PROTOCOL_NAMES[protocol]]


# bind addresses that mean "every interface": a client on this machine reaches them at localhost
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def default_url(protocol: str) -> str:
    """HOST:PORT of the server `make serve` / `fastpath serve` started with this environment: the client
    commands' default ``--url``.

    The host is ``$HOST`` (the address `make serve HOST=...` binds), ``localhost`` when it is unset or
    a wildcard (0.0.0.0, ::); the port is ``$HTTP_PORT`` for http, ``$GRPC_PORT`` for grpc (the variables
    `fastpath serve` reads), else Triton's 8000 / 8001.

    Raises:
        SystemExit: the port variable is not a number (the message names it).
    """
    host = os.environ.get("HOST", "").strip()
    if host in WILDCARD_HOSTS:
        host = "localhost"
    elif ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    return f"{host}:{env_int(port_variable(protocol), default_port(protocol))}"


def port_variable(protocol: str) -> str:
    """The environment variable of ``protocol``'s port that `make serve` and `fastpath serve` read."""
    return "GRPC_PORT" if protocol == "grpc" else "HTTP_PORT"


URL_DEFAULT = ("Default: $HOST:$HTTP_PORT ($GRPC_PORT with --protocol grpc), the variables `make serve` reads; "
               "localhost for an unset or wildcard HOST, 8000 (8001) for an unset port.")


def port_hint(protocol: str, *, url_given: bool = True) -> str:
    """What to check when ``--url`` (without it, the port variable :func:`default_url` read) did not answer in
    ``--protocol``: the port of the other protocol."""
    other = "grpc" if protocol == "http" else "http"
    where = "--url" if url_given else f"${port_variable(protocol)} (no --url given)"
    return (f"is {where} the {PROTOCOL_NAMES[protocol]} port (default {default_port(protocol)})? "
            f"for the {PROTOCOL_NAMES[other]} port use --protocol {other}")


def error_line(error: Exception, protocol: str, *, url_given: bool = True) -> str:
    """One line for a failed CLI command: the client error's message (whitespace folded), with
    :func:`port_hint` when the server answered another protocol, or could not be reached on a ``--url``
    (``url_given``) port that is not the protocol's default. Without ``--url`` the address is
    :func:`default_url`'s, the port `make serve` opened for that protocol, so only the server's absence is
    left to ask about, and the client's message asks it."""
    from fastpath_client import ProtocolMismatchError, ServerConnectionError, WrongPortError

    if isinstance(error, WrongPortError):
        return (f"{error.url} does not serve Triton's HTTP API (it answered {error.server_message}, as Triton's metrics "
                f"port does); {port_hint(protocol, url_given=url_given)}")
    if isinstance(error, ProtocolMismatchError):
        other = "grpc" if protocol == "http" else "http"
        return (f"{error.url} did not answer in {PROTOCOL_NAMES[protocol]} (it looks like Triton's "
                f"{PROTOCOL_NAMES[other]} port); {port_hint(protocol, url_given=url_given)}")
    text = " ".join(str(error).split())  # a ServerConnectionError already asks whether tritonserver runs there
    if isinstance(error, ServerConnectionError) and url_given and error.url.rpartition(":")[2] != str(default_port(protocol)):
        text += f"; if it does, {port_hint(protocol)}"  # on the protocol's default port that hint says nothing new
    return text


def quiet_gevent_interrupts() -> None:
    """Let a Ctrl-C during an HTTP call end as the CLI's one line: tritonclient.http runs on geventhttpclient, whose
    gevent hub prints a KeyboardInterrupt raised in its event loop and a timestamp line before passing it on to the
    caller; listed in this thread's hub's ``NOT_ERROR``, it is only passed on (gevent's documented knob)."""
    import gevent

    hub = gevent.get_hub()
    if KeyboardInterrupt not in hub.NOT_ERROR:
        hub.NOT_ERROR = (*hub.NOT_ERROR, KeyboardInterrupt)
