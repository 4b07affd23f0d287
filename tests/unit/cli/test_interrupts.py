"""Ctrl-C and the `fastpath` CLI: whenever it comes, one line on stderr and exit 130, never a traceback or a
library's own report of the interrupt; once a command has returned, a Ctrl-C no longer changes its exit code."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fastpath import cli as entry
from fastpath.cli import main as cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("command", ["swap", "rollback"])
def test_an_interrupted_swap_or_rollback_says_the_server_may_have_made_the_change(monkeypatch, capsys, command):
    """Invariant: a swap or rollback interrupted after it was sent may still complete on the server (it does), so its
    one line says so and names `fastpath status`."""
    from fastpath.cli import admin

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(admin, "_run", interrupted)
    argv = [command, "text_embedding"] + (["2"] if command == "swap" else []) + ["--url", "127.0.0.1:1"]
    assert cli.main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        f"fastpath {command}: interrupted (the server may have made the change already: `fastpath status` shows the version it serves)"]


def test_the_console_script_turns_an_interrupt_outside_main_into_one_line_and_then_ignores_sigint(monkeypatch, capsys):
    """Invariants: a KeyboardInterrupt that escapes ``main`` (a Ctrl-C while the CLI's modules import) ends the console
    script with exit 130 and the one line "fastpath: interrupted"; after a command returns, SIGINT is ignored, so a
    Ctrl-C while the interpreter closes its connections keeps the command's own exit code."""
    before = signal.getsignal(signal.SIGINT)
    try:
        def interrupted(argv=None):
            raise KeyboardInterrupt

        monkeypatch.setattr(cli, "main", interrupted)
        assert entry.run() == 130
        assert capsys.readouterr().err.strip().splitlines() == ["fastpath: interrupted"]
        monkeypatch.setattr(cli, "main", lambda argv=None: 3)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert entry.run() == 3
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_an_http_admin_call_prints_only_the_cli_line():
    """Invariant: Ctrl-C while `fastpath status` waits on an HTTP server that never answers ends with exit 130 and only
    "fastpath status: interrupted" on stderr: not gevent's hub report of the KeyboardInterrupt (the exception's name
    and a timestamp line, which tritonclient.http's geventhttpclient prints unless told otherwise), not a traceback."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "backend"), os.path.join(ROOT, "client")]),
               FASTPATH_ADMIN_KEY="unused")
    process = subprocess.Popen([sys.executable, "-m", "fastpath", "status", "text_embedding", "--url",
                                f"127.0.0.1:{silent.getsockname()[1]}"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the CLI holds a connection to the silent server
            silent.settimeout(0.1)
            try:
                connection, _ = silent.accept()
                break
            except TimeoutError:
                assert process.poll() is None, process.stderr.read()
        else:
            pytest.fail("fastpath status never connected")
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        silent.close()
    lines = [line for line in err.splitlines() if " fastpath INFO " not in line]
    assert process.returncode == 130, err
    assert lines == ["fastpath status: interrupted"], err
    connection.close()
