"""Checks of the client's arguments: replica addresses (``HOST:PORT`` as tritonclient takes them: no scheme,
IPv6 hosts in brackets), timeouts and model versions."""

from __future__ import annotations

import ipaddress
import numbers
import socket
from collections.abc import Sequence

from fastpath_client.errors import InvalidInputError


def host_port(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``url``: ``"127.0.0.1:8000"`` -> ``("127.0.0.1", 8000)``, ``"[::1]:8001"`` -> ``("::1", 8001)``.

    Raises:
        InvalidInputError: a scheme (``http://``), no port, a port that is not a number in 1-65535, or no host;
            the message quotes the url and shows the expected form.
    """
    expected = "expected HOST:PORT, e.g. 127.0.0.1:8000 (the HTTP port) or 127.0.0.1:8001 (gRPC)"
    if "://" in url:
        raise InvalidInputError(f"url {url!r} has a scheme; {expected}")
    if ":" not in url:
        raise InvalidInputError(f"url {url!r} names no port; {expected}")
    if url.startswith("["):
        host, _, rest = url[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = url.rpartition(":")
        if ":" in host:  # a bare IPv6 address: its last group is no port
            raise InvalidInputError(f"url {url!r}: write an IPv6 host in brackets, e.g. [::1]:8000; {expected}")
    if not host or not port:
        raise InvalidInputError(f"url {url!r} names no {'host' if port else 'port'}; {expected}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidInputError(f"url {url!r}: port {port!r} is not a number in 1-65535; {expected}")
    return host, int(port)


def _destination(address: str) -> str:
    """The host a connection to ``address`` reaches, one spelling per host: an IPv4-mapped IPv6 address as its IPv4
    address, the unspecified address (0.0.0.0, ::) as this host's loopback (where Linux connects it)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope id (fe80::1%eth0) is no part of the address
    except ValueError:
        return address.lower()
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        ip = ipaddress.ip_address("127.0.0.1" if ip.version == 4 else "::1")
    return str(ip)


def distinct_replicas(urls: Sequence[str]) -> None:
    """Refuse a fleet that names one replica twice: the same ``HOST:PORT``, or two hosts that resolve to a shared
    address with the same port (``localhost:8000``, ``127.0.0.1:8000``, ``[::ffff:127.0.0.1]:8000`` and
    ``0.0.0.0:8000`` are one). A second swap of one replica is a no-op;
    a second rollback undoes the first. A host that does not resolve is compared as written (connecting to it fails
    on its own); a server reached through two different addresses (0.0.0.0 bound, LAN and loopback) is not seen.

    Raises:
        InvalidInputError: a malformed url (:func:`host_port`), or the first pair that names one replica, quoted.
    """
    owner: dict[tuple[str, int], int] = {}
    for index, url in enumerate(urls):
        host, port = host_port(url)
        try:
            addresses = {_destination(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        except (OSError, UnicodeError):  # socket.gaierror is an OSError
            addresses = {host.lower()}
        for address in sorted(addresses):
            other = owner.setdefault((address, port), index)
            if other == index:
                continue
            if urls[other] == url:
                raise InvalidInputError(f"replica {url} is named more than once; list each replica once")
            raise InvalidInputError(f"replicas {urls[other]} and {url} are one (both reach {address} port {port}); "
                                    "list each replica once")


def positive_timeout(timeout_s: float) -> float:
    """``timeout_s`` as float seconds.

    Raises:
        InvalidInputError: not a number, NaN, or <= 0 (0 would fail every call at once as unreachable).
    """
    try:
        value = float(timeout_s)
    except (TypeError, ValueError):
        raise InvalidInputError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}") from None
    if not value > 0:  # NaN too
        raise InvalidInputError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    return value


def model_version(version: object) -> int:
    """``version`` as an int, as ``fastpath_admin`` takes it (a Python or numpy integer >= 1).

    Raises:
        InvalidInputError: not an integer (a float such as 2.5, a bool, a string such as "2": each would
            otherwise be coerced to some version and swap to it), or < 1; the message quotes the value.
    """
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise InvalidInputError(f"version must be an integer model version (1, 2, ...), got {version!r} "
                                f"of type {type(version).__name__}")
    if version < 1:
        raise InvalidInputError(f"version must be >= 1 (Triton's model versions start at 1), got {version!r}")
    return int(version)


def inference_version(version: object) -> str:
    """``version`` as Triton's inference URL and gRPC request take it: "" (the model's version policy picks) or
    the decimal string of an integer >= 1.

    Raises:
        InvalidInputError: anything else, e.g. "abc", "1.5", "0" or -1, which Triton answers over HTTP with a bare
            404 "Not Found" that reads as an unknown model; the message quotes the value.
    """
    if version == "" or version is None:
        return ""
    text = str(version) if isinstance(version, numbers.Integral) and not isinstance(version, bool) else version
    if not isinstance(text, str) or not text.isdecimal() or not text.isascii() or int(text) < 1:
        raise InvalidInputError(f"version must be \"\" (the server's choice) or a model version >= 1 such as \"2\", "
                                f"got {version!r}")
    return text
