"""The client's argument checks: a replica address is HOST:PORT, a timeout a positive number of seconds, a model
version an integer >= 1."""

from __future__ import annotations

import math
import re
import socket

import numpy as np
import pytest

from fastpath_client import Client, InvalidInputError
from fastpath_client.checks import distinct_replicas, host_port, model_version, positive_timeout


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


@pytest.mark.parametrize("version", [1, 2, np.int64(3), np.uint8(4)])
def test_a_model_version_is_any_integer_of_one_or_more(version):
    """Invariant: Python and numpy integers >= 1 pass through as the same int."""
    assert model_version(version) == int(version) and type(model_version(version)) is int


@pytest.mark.parametrize("version", [2.5, 2.0, True, "2", None, np.float32(1.0), 0, -1])
def test_a_model_version_that_is_no_integer_or_below_one_is_refused_not_coerced(version):
    """Invariant: a float, bool, string or None is refused naming the value (int() would turn 2.5 into 2 and True
    into 1 and swap to that version), and so is a version below 1; nothing is sent to the server."""
    with pytest.raises(InvalidInputError, match="version must be") as raised:
        model_version(version)
    assert repr(version) in str(raised.value)


def test_swap_refuses_a_bad_version_before_any_request():
    """Invariant: Client.swap checks the version before it calls the server: a client for a port nothing listens
    on still raises the version's InvalidInputError, not a connection error."""
    with pytest.raises(InvalidInputError, match="got 2.5"):
        Client("127.0.0.1:9", admin_key="k").swap("text_embedding", 2.5)


def test_an_inference_version_is_empty_or_a_positive_integer_string():
    """Invariant: infer's ``version`` reaches Triton as "" or the decimal string of an integer >= 1; anything
    else is refused client-side, quoting it (Triton's HTTP answer to "abc" is a bare 404 that reads as an
    unknown model)."""
    from fastpath_client.checks import inference_version

    assert [inference_version(v) for v in ("", None, "2", 2, np.int64(3))] == ["", "", "2", "2", "3"]
    for bad in ("abc", "1.5", "0", "-1", -1, 0, True, 2.0, "٣", " 2"):
        with pytest.raises(InvalidInputError, match=r"version must be \"\" \(the server's choice\) or a model version >= 1"):
            inference_version(bad)


def _resolves(host: str, address: str) -> bool:
    try:
        return address in {info[4][0] for info in socket.getaddrinfo(host, 1, type=socket.SOCK_STREAM)}
    except OSError:
        return False


def test_a_fleet_naming_one_replica_twice_is_refused_however_it_is_spelled():
    """Invariant: distinct_replicas refuses a url listed twice, and two spellings that resolve to a shared address
    on the same port (localhost and 127.0.0.1), naming both; the same host on another port, or another host, is
    another replica."""
    distinct_replicas(["127.0.0.1:8000", "127.0.0.1:8001", "[::1]:8000"])
    with pytest.raises(InvalidInputError, match=r"^replica 127.0.0.1:8000 is named more than once; list each replica once$"):
        distinct_replicas(["127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8000"])
    # an IPv4-mapped IPv6 address and the unspecified address (Linux connects it to this host) are 127.0.0.1 too
    for other in ("[::ffff:127.0.0.1]:8000", "0.0.0.0:8000", "127.1:8000"):
        with pytest.raises(InvalidInputError, match=rf"^replicas 127.0.0.1:8000 and {re.escape(other)} are one \(both reach 127.0.0.1 port 8000\)"):
            distinct_replicas(["127.0.0.1:8000", other])
    with pytest.raises(InvalidInputError, match=r"are one \(both reach ::1 port 8000\)"):
        distinct_replicas(["[::1]:8000", "[::]:8000"])
    if not _resolves("localhost", "127.0.0.1"):
        pytest.skip("localhost does not resolve to 127.0.0.1 on this machine (/etc/hosts)")
    with pytest.raises(InvalidInputError, match=r"^replicas 127.0.0.1:8000 and localhost:8000 are one \(both reach 127.0.0.1 port 8000\)"):
        distinct_replicas(["127.0.0.1:8000", "localhost:8000"])
    distinct_replicas(["127.0.0.1:8000", "localhost:8001"])
    with pytest.raises(InvalidInputError, match="has a scheme"):  # a malformed one is refused like everywhere else
        distinct_replicas(["127.0.0.1:8000", "http://localhost:8001"])
