"""The client's argument checks: a replica address is HOST:PORT, a timeout a positive number of seconds."""

from __future__ import annotations

import math

import pytest

from fastpath_client import Client, InvalidInputError
from fastpath_client.checks import host_port, positive_timeout


@pytest.mark.parametrize(("url", "expected"), [
    ("127.0.0.1:8000", ("127.0.0.1", 8000)),
    ("localhost:1", ("localhost", 1)),
    ("triton.example:65535", ("triton.example", 65535)),
    ("[::1]:8001", ("::1", 8001)),
])
def test_host_port_splits_host_and_port(url, expected):
    assert host_port(url) == expected


@pytest.mark.parametrize(("url", "message"), [
    ("http://127.0.0.1:8000", r"has a scheme"),
    ("127.0.0.1", r"names no port"),
    ("127.0.0.1:", r"names no port"),
    (":8000", r"names no host"),
    ("127.0.0.1:notaport", r"port 'notaport' is not a number in 1-65535"),
    ("127.0.0.1:70000", r"port '70000' is not a number in 1-65535"),
    ("127.0.0.1:0", r"port '0' is not a number in 1-65535"),
    ("::1:8000", r"write an IPv6 host in brackets"),
    ("[::1]", r"names no port"),
    ("", r"names no port"),
])
def test_malformed_urls_are_refused_with_the_expected_form(url, message):
    """Every refusal quotes the url and shows HOST:PORT, so a typo never reaches tritonclient (whose
    int() of a bad port raised a bare ValueError) or retries against a port nobody named."""
    with pytest.raises(InvalidInputError, match=message) as info:
        host_port(url)
    assert repr(url) in str(info.value) and "expected HOST:PORT" in str(info.value)


@pytest.mark.parametrize("value", [0, -1, math.nan, "soon", None])
def test_non_positive_or_non_numeric_timeouts_are_refused(value):
    with pytest.raises(InvalidInputError, match="timeout_s must be"):
        positive_timeout(value)


def test_a_call_timeout_is_checked_like_the_clients_own():
    """timeout_s=0 on one call used to surface as "is tritonserver running?" (HTTP) or DEADLINE_EXCEEDED (gRPC);
    both protocols now refuse it before any connection, like the constructor does."""
    for protocol in ("http", "grpc"):
        with pytest.raises(InvalidInputError, match="timeout_s must be > 0"):
            Client("127.0.0.1:9", protocol=protocol, timeout_s=0)
        with Client("127.0.0.1:9", protocol=protocol) as client:  # nothing listens on port 9: a check, not a call
            for value in (0, -1):
                with pytest.raises(InvalidInputError, match="timeout_s must be > 0"):
                    client.status("text_embedding", timeout_s=value)
                with pytest.raises(InvalidInputError, match="timeout_s must be > 0"):
                    client.swap("text_embedding", 2, timeout_s=value)
    assert positive_timeout(2) == 2.0
