"""Where `fastpath swap | rollback | status | bench` go without --url: the server `make serve` started
with the same environment ($HOST, $HTTP_PORT, $GRPC_PORT)."""

from __future__ import annotations

import pytest

from fastpath.cli import main as cli
from fastpath.cli.admin import _urls
from fastpath.cli.common import default_url


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("HOST", "HTTP_PORT", "GRPC_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_without_the_variables_it_is_tritons_default_ports_on_localhost():
    assert default_url("http") == "localhost:8000" and default_url("grpc") == "localhost:8001"


def test_the_ports_are_the_ones_fastpath_serve_reads(monkeypatch):
    """Invariant: the port default_url gives for a protocol is the one `fastpath serve` listens on for it."""
    monkeypatch.setenv("HTTP_PORT", "18510")
    monkeypatch.setenv("GRPC_PORT", "18511")
    serve_args = cli.build_parser().parse_args(["serve"])
    assert default_url("http") == f"localhost:{serve_args.http_port}" == "localhost:18510"
    assert default_url("grpc") == f"localhost:{serve_args.grpc_port}" == "localhost:18511"


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "localhost:18510"),  # make serve's default: every interface
    ("::", "localhost:18510"),
    ("", "localhost:18510"),
    ("127.0.0.1", "127.0.0.1:18510"),
    ("10.1.2.3", "10.1.2.3:18510"),
    ("::1", "[::1]:18510"),
    ("[::1]", "[::1]:18510"),
    ("gpu-node-3", "gpu-node-3:18510"),
])
def test_the_host_is_the_address_make_serve_binds_or_localhost_for_a_wildcard(monkeypatch, host, url):
    monkeypatch.setenv("HOST", host)
    monkeypatch.setenv("HTTP_PORT", "18510")
    assert default_url("http") == url


def test_a_port_that_is_not_a_number_exits_naming_the_variable(monkeypatch):
    monkeypatch.setenv("GRPC_PORT", "80o1")
    with pytest.raises(SystemExit, match="GRPC_PORT='80o1' is not a port number"):
        default_url("grpc")


def test_admin_commands_take_the_default_only_without_url(monkeypatch):
    """`fastpath status|swap|rollback` without --url reach the server `make serve HTTP_PORT=...` started;
    --url values (repeated or comma-separated) replace it."""
    monkeypatch.setenv("HTTP_PORT", "18510")
    monkeypatch.setenv("GRPC_PORT", "18511")
    assert _urls(None) == ["localhost:18510"] and _urls(None, "grpc") == ["localhost:18511"]
    assert _urls(["a:1,b:2", "c:3"]) == ["a:1", "b:2", "c:3"]


def test_a_failed_connection_names_the_port_to_check_only_off_the_protocols_default_port():
    """The client's connection error already asks whether tritonserver runs there; the CLI adds which port --url
    should be only when --url is not the protocol's default port (on it, the hint would say nothing new); a port
    that answered in the other protocol always gets the hint."""
    from fastpath.cli.common import error_line
    from fastpath_client import ProtocolMismatchError, ServerConnectionError, WrongPortError

    refused = "connection failed: ConnectionRefusedError; is tritonserver running and listening there?"
    assert error_line(ServerConnectionError(refused, url="localhost:8000"), "http") == refused
    assert error_line(ServerConnectionError(refused, url="localhost:8001"), "http") == (
        f"{refused}; if it does, is --url the HTTP port (default 8000)? for the gRPC port use --protocol grpc")
    assert error_line(ServerConnectionError(refused, url="localhost:8001"), "grpc") == refused
    other = error_line(ProtocolMismatchError("not HTTP", url="localhost:8001"), "http")
    assert other.endswith("for the gRPC port use --protocol grpc")
    metrics = error_line(WrongPortError("x", server_message="HTTP 405 Method Not Allowed", url="localhost:8002"), "http")
    assert metrics == ("localhost:8002 does not serve Triton's HTTP API (it answered HTTP 405 Method Not Allowed, as "
                       "Triton's metrics port does); is --url the HTTP port (default 8000)? for the gRPC port use --protocol grpc")


def test_without_url_a_failed_connection_gets_no_port_hint():
    """Without --url the CLI used the port `make serve` opened for the protocol itself (default_url), so asking
    whether --url is the right port names an option the user never gave; the client's question stays."""
    from fastpath.cli.common import error_line
    from fastpath_client import ServerConnectionError

    refused = "connection failed: ConnectionRefusedError; is tritonserver running and listening there?"
    assert error_line(ServerConnectionError(refused, url="localhost:18510"), "http", url_given=False) == refused


def test_without_url_a_port_of_the_other_protocol_names_the_port_variable():
    """Without --url the address came from $HTTP_PORT / $GRPC_PORT: the hint names that variable, not --url."""
    from fastpath.cli.common import error_line
    from fastpath_client import ProtocolMismatchError

    line = error_line(ProtocolMismatchError("not HTTP", url="localhost:18101"), "http", url_given=False)
    assert line.endswith("is $HTTP_PORT (no --url given) the HTTP port (default 8000)? for the gRPC port use --protocol grpc")
    line = error_line(ProtocolMismatchError("not gRPC", url="localhost:18100"), "grpc", url_given=False)
    assert line.endswith("is $GRPC_PORT (no --url given) the gRPC port (default 8001)? for the HTTP port use --protocol http")


@pytest.mark.parametrize(("url", "message"), [
    (",", "--url ',' names no replica; expected HOST:PORT"),
    ("127.0.0.1:notaport", "port 'notaport' is not a number in 1-65535"),
    ("127.0.0.1", "url '127.0.0.1' names no port"),
    ("127.0.0.1:8000,127.0.0.1:8o01", "port '8o01' is not a number"),
])
def test_admin_commands_refuse_a_malformed_url_list_in_one_line_before_any_call(capsys, url, message):
    """Every --url is checked before any replica is contacted (a fleet swap must not move the first replica and
    then trip over the second address); exit 1 with one line on stderr, no traceback, nothing on stdout."""
    for argv in (["status", "text_embedding", "--url", url], ["swap", "text_embedding", "2", "--url", url]):
        assert cli.main(argv) == 1
        out, err = capsys.readouterr()
        assert out == "" and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bench_says_it_waits_for_a_server_that_does_not_answer(monkeypatch, capsys):
    """Invariant: when a server is not ready within SERVER_QUIET_S (or SERVER_WAIT_S, if shorter), bench says on stderr that it
    waits up to SERVER_WAIT_S (was a silent minute), then fails with the client's not-ready error. A server that
    answers the other protocol still fails at once with one line (tests/e2e/test_client.py)."""
    import asyncio
    import socket

    from fastpath.cli import bench
    from fastpath_client import AsyncClient

    with socket.socket() as probe:  # a free port: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(bench, "SERVER_WAIT_S", 0.5)

    async def wait() -> None:
        async with AsyncClient(f"127.0.0.1:{port}", protocol="http") as client:
            await bench._wait_for_model(client, "text_embedding", "http")

    with pytest.raises(bench.BenchError, match=f"server 127.0.0.1:{port} not ready after 0.5 s"):
        asyncio.run(wait())
    assert f"fastpath bench: the server at 127.0.0.1:{port} is not ready yet; waiting up to 0.5 s" in capsys.readouterr().err


def test_bench_reads_metrics_from_the_metrics_port_make_serve_was_given(monkeypatch):
    """`fastpath bench`'s metrics URL follows $METRICS_PORT as its server URL follows $HTTP_PORT: a server
    started on non-default ports is scraped where it listens; --metrics-url still wins; Triton's 8002 otherwise."""
    from fastpath.cli.bench import default_metrics_url

    monkeypatch.delenv("METRICS_PORT", raising=False)
    assert default_metrics_url(None, "127.0.0.1:18400") == "127.0.0.1:8002"
    monkeypatch.setenv("METRICS_PORT", "18402")
    assert default_metrics_url(None, "127.0.0.1:18400") == "127.0.0.1:18402"
    assert default_metrics_url("10.0.0.5:9000", "127.0.0.1:18400") == "10.0.0.5:9000"
