"""Checks of the client's arguments: replica addresses (``HOST:PORT`` as tritonclient takes them: no scheme,
IPv6 hosts in brackets) and timeouts."""

from __future__ import annotations

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
