"""The port the liveness check and the unload hook talk to, as `make serve` users set it."""

from __future__ import annotations

import argparse

import pytest

from fastpath.server.triton_api import add_http_port


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_http_port(parser)
    return parser.parse_args(argv).http_port


def test_http_port_defaults_to_the_variable_make_serve_reads(monkeypatch):
    """--http-port defaults to $HTTP_PORT (as the fastpath client commands and the container entrypoint do), to
    8000 without it, and an explicit --http-port wins."""
    monkeypatch.delenv("HTTP_PORT", raising=False)
    assert _parse([]) == 8000
    monkeypatch.setenv("HTTP_PORT", "18100")
    assert _parse([]) == 18100
    assert _parse(["--http-port", "9000"]) == 9000


def test_an_http_port_variable_that_is_no_number_is_a_usage_error(monkeypatch, capsys):
    """HTTP_PORT=abc exits 2 naming the variable and its value, not a traceback or a silent 8000."""
    monkeypatch.setenv("HTTP_PORT", "abc")
    with pytest.raises(SystemExit) as exit_info:
        _parse([])
    assert exit_info.value.code == 2
    assert "HTTP_PORT='abc' is not a port number" in capsys.readouterr().err


def test_a_server_pid_that_is_no_tritonserver_is_named(capsys):
    """--server-pid of a process that is not a tritonserver (here this test's own) exits 1 saying so, instead of
    reporting "0 of N python-backend stubs alive" for every ready model."""
    import os

    from fastpath.server.stubs import main

    assert main(["--check", "--http-port", "1", "--server-pid", str(os.getpid())]) == 1
    assert f"--server-pid {os.getpid()} is not a running tritonserver" in capsys.readouterr().err
