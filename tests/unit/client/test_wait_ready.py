"""wait_ready says what answered when a URL answers, but not as Triton (a proxy's 404, another service)."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from fastpath_client import Client, RequestTimeoutError


class _Proxy(http.server.BaseHTTPRequestHandler):
    server_version = "nginx"
    sys_version = ""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b"<html><body>404 Not Found</body></html>"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_foreign_http_answer_is_named_in_the_timeout(proxy):
    """The message names the status, the Server header and the body's start, not 'unreachable'."""
    with Client(proxy, "http") as client, pytest.raises(RequestTimeoutError) as info:
        client.wait_ready(timeout_s=0.3)
    message = str(info.value)
    assert "answered HTTP 404 Not Found, Server: nginx" in message and "404 Not Found</body>" in message
    assert "unreachable" not in message


def test_nothing_listening_is_still_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    with Client(f"127.0.0.1:{port}", "http") as client, pytest.raises(RequestTimeoutError, match="unreachable or still starting"):
        client.wait_ready(timeout_s=0.3)
