"""A python-backend stub killed under a running tritonserver: Triton 2.51 keeps the model ready but
fails every request; the container probe (``python -m fastpath.server.stubs --check``) says so, and
FastPath's stub supervisor (what ``fastpath serve`` runs) reloads the model."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastpath.cli.serve import stub_supervisor
from fastpath.server.process import group_members
from fastpath.server.stubs import list_stubs
from fastpath.server.stubs import main as check_stubs
from fastpath.server.triton_api import main as unload_all
from tests.conftest import start_server, wait_for

pytestmark = pytest.mark.e2e
MODEL = "text_embedding"
KEY = "test-stub-death-key"  # the supervisor's reload goes through the restricted repository API


def _embed(client, texts):
    array = np.array(texts, dtype=object).reshape(-1, 1)
    tensor = httpclient.InferInput("TEXT", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return client.infer(MODEL, [tensor]).as_numpy("EMBEDDING")


def _error(client, texts) -> str | None:
    try:
        _embed(client, texts)
    except InferenceServerException as exc:
        return exc.message()
    return None


def test_a_killed_stub_is_replaced_by_a_reload_and_the_model_serves_again(tmp_path, sentences, monkeypatch):
    server = start_server(tmp_path, models=(MODEL,), admin_key=KEY)
    supervisor = stub_supervisor(server)
    monkeypatch.setenv("FASTPATH_ADMIN_KEY", KEY)  # the container probe reads the key from its environment
    probe = ["--check", "--http-port", str(server.options.http_port), "--server-pid", str(server.pid)]
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        texts = sentences[:8]
        expected = _embed(client, texts)
        assert check_stubs(probe) == 0
        supervisor.check()  # its first look (start() takes it too): the stub is alive
        (stub,) = [s for s in list_stubs(group_members(server.pid)) if s.model == MODEL]
        os.kill(stub.pid, signal.SIGKILL)
        # what Triton 2.51 does on its own: the model stays ready and every request fails
        assert wait_for(lambda: "is not healthy" in (_error(client, texts) or ""), timeout_s=1.5, poll_s=0.1)
        assert client.is_model_ready(MODEL)
        assert check_stubs(probe) == 1  # the container liveness probe fails
        supervisor.start()
        started = time.monotonic()
        assert wait_for(lambda: _error(client, texts) is None, timeout_s=60, poll_s=0.25), _error(client, texts)
        recovered_s = time.monotonic() - started
        np.testing.assert_allclose(_embed(client, texts), expected, atol=1e-5)
        assert supervisor.reloaded == [MODEL] and supervisor.failure is None
        (new,) = [s for s in list_stubs(group_members(server.pid)) if s.model == MODEL]
        assert new.pid != stub.pid and new.instance == stub.instance
        assert check_stubs(probe) == 0
        # the Kubernetes preStop hook: unload (drain) every model before the SIGTERM
        supervisor.stop()
        assert unload_all(["--unload-all", "--http-port", str(server.options.http_port)]) == 0
        assert not client.is_model_ready(MODEL) and supervisor.reloaded == [MODEL]
        print(f"serving again {recovered_s:.1f} s after the stub's death was seen")
    finally:
        supervisor.stop()
        server.stop()
