"""fastpath_client against tiny probe models on a real tritonserver: timeouts, system shared memory
(and its cleanup), and retries/wait_ready while the server or the model is still loading.

The probe models (python_backend QA style, one per behaviour) are written into a temporary model
repository; ``benchmarks/client_shm.py`` reuses :func:`write_probe_repository`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from fastpath_client import (
    AsyncClient,
    Client,
    ModelNotReadyError,
    RequestTimeoutError,
    RetryPolicy,
    ServerConnectionError,
)
from fastpath_client.shm import leaked_regions
from tests.conftest import free_ports, start_server

pytestmark = pytest.mark.e2e
PROTOCOLS = ["http", "grpc"]
LOAD_DELAY_S = 3.0

PROBE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IMAGES" data_type: TYPE_UINT8 dims: [ -1, -1, -1, 3 ] optional: true }},
        {{ name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] optional: true }} ]
output [ {{ name: "SUM" data_type: TYPE_INT64 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
parameters {{ key: "load_delay_s" value: {{ string_value: "{load_delay_s}" }} }}
"""

PROBE_MODEL = '''
"""Probe: SUM[i] = sum of the bytes of image i (a large input, a small output); DELAY_MS sleeps first."""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        time.sleep(float(config["parameters"]["load_delay_s"]["string_value"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS")
            if delay is not None:
                time.sleep(int(delay.as_numpy().reshape(-1)[0]) / 1000.0)
            images = pb_utils.get_input_tensor_by_name(request, "IMAGES")
            if images is None:
                sums = np.zeros(0, np.int64)
            else:
                pixels = images.as_numpy()
                sums = pixels.reshape(pixels.shape[0], -1).sum(axis=1, dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", sums)]))
        return responses
'''


def write_probe_repository(root: Path) -> Path:
    """A model repository with ``probe`` (2 instances, loads at once) and ``slow_load`` (loads in 3 s)."""
    for name, instances, load_delay_s in (("probe", 2, 0.0), ("slow_load", 1, LOAD_DELAY_S)):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(
            PROBE_CONFIG.format(name=name, instances=instances, load_delay_s=load_delay_s))
        (root / name / "1" / "model.py").write_text(PROBE_MODEL)
    return root


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    server = start_server(root, models=("probe",), repository=write_probe_repository(root / "repository"))
    try:
        yield server
    finally:
        server.stop()


def _url(server, protocol):
    return server.http_url if protocol == "http" else server.grpc_url


def _server_regions(server):
    with httpclient.InferenceServerClient(server.http_url) as client:
        return [r["name"] for r in client.get_system_shared_memory_status()]


def _images(count=32, side=128):
    return np.random.default_rng(7).integers(0, 256, (count, side, side, 3), dtype=np.uint8)


async def _async_infer(server, protocol, inputs_list, **options):
    async with AsyncClient(_url(server, protocol), protocol, **options) as client:
        return [await client.infer("probe", inputs) for inputs in inputs_list], client.counters


def _infer(server, protocol, mode, inputs, **options):
    """Outputs of each request in ``inputs`` (one dict, or a list of them) and the client's counters."""
    inputs_list = inputs if isinstance(inputs, list) else [inputs]
    if mode == "async":
        outputs, counters = asyncio.run(_async_infer(server, protocol, inputs_list, **options))
    else:
        with Client(_url(server, protocol), protocol, **options) as client:
            outputs, counters = [client.infer("probe", i) for i in inputs_list], client.counters
    return (outputs if isinstance(inputs, list) else outputs[0]), counters


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_timeout_cuts_the_call_and_is_not_retried(probe_server, protocol, mode):
    inputs = {"DELAY_MS": np.array([3000], np.int32)}
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError) as info:
        _infer(probe_server, protocol, mode, inputs, timeout_s=0.5)
    assert time.monotonic() - started < 2.5  # the 3 s request was abandoned, not waited for
    assert "probe" in str(info.value) and isinstance(info.value, TimeoutError)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_32_images_through_shared_memory_and_nothing_left_behind(probe_server, protocol, mode):
    """Two requests of 32 images: one region registered and reused (the second request's sums are its
    own), then unregistered and unlinked by close()."""
    first, second = _images(), _images()[::-1].copy()
    outputs, counters = _infer(probe_server, protocol, mode, [{"IMAGES": first}, {"IMAGES": second}])
    for images, output in zip((first, second), outputs):
        assert output["SUM"].tolist() == images.reshape(32, -1).sum(axis=1, dtype=np.int64).tolist()
    assert counters["shm_requests"] == 2 and counters["shm_registrations"] == 1
    assert counters["shm_bytes"] == 2 * first.nbytes
    assert leaked_regions(os.getpid()) == [] and _server_regions(probe_server) == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shared_memory_never_sends_the_same_bytes_inline(probe_server, protocol):
    images = _images(4, 64)
    outputs, counters = _infer(probe_server, protocol, "sync", {"IMAGES": images}, shared_memory="never")
    assert outputs["SUM"].tolist() == images.reshape(4, -1).sum(axis=1, dtype=np.int64).tolist()
    assert counters["shm_requests"] == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_auto_mode_falls_back_inline_when_the_server_cannot_map_regions(probe_server, monkeypatch, mode):
    """A server on another host or /dev/shm namespace (a container) cannot open our key: simulated by
    registering a key that does not exist. "auto" then sends tensors inline, this time and from then on."""
    import fastpath_client._core as core

    created = []

    def unreachable_region(byte_size):
        region = real_new_region(byte_size)
        created.append(region.key)
        region.key = "fastpath_client_key_the_server_cannot_open"
        return region

    real_new_region = core.new_region
    monkeypatch.setattr(core, "new_region", unreachable_region)
    images = _images()  # 1.5 MB: above the 1 MiB threshold of "auto"
    outputs, counters = _infer(probe_server, "http", mode, [{"IMAGES": images}, {"IMAGES": images}])
    expected = images.reshape(32, -1).sum(axis=1, dtype=np.int64).tolist()
    assert [o["SUM"].tolist() for o in outputs] == [expected, expected]
    assert len(created) == 1 and counters["shm_requests"] == 0 and counters["shm_registrations"] == 0
    assert leaked_regions(os.getpid()) == [] and _server_regions(probe_server) == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_region_of_a_timed_out_request_is_unregistered_by_close(probe_server, mode):
    """Triton refuses to unregister a region its request still reads; close() waits for it, then cleans up."""
    inputs = {"IMAGES": _images(8), "DELAY_MS": np.array([1500], np.int32)}
    with pytest.raises(RequestTimeoutError):
        _infer(probe_server, "grpc", mode, inputs, timeout_s=0.3)
    assert leaked_regions(os.getpid()) == [] and _server_regions(probe_server) == []


def _start_unready(tmp_path, models):
    from fastpath.server.process import ServerOptions, TritonServer

    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(model_repository=write_probe_repository(tmp_path / "repository"), models=models,
                            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, host="127.0.0.1")
    return TritonServer(options, log_path=tmp_path / "tritonserver.log").start()


def test_retries_and_wait_ready_while_server_and_model_load(tmp_path):
    """Endpoints open only once slow_load has loaded (~3 s): gRPC infer retries through connection
    refusals while an HTTP client waits in wait_ready. Then, during a reload through the repository
    API, infer retries through "no available versions" (ModelNotReadyError)."""
    server = _start_unready(tmp_path, ("slow_load",))
    try:
        waited = []

        def wait():  # its own client: tritonclient.http clients belong to the thread that made them (gevent)
            with Client(server.http_url) as client:
                client.wait_ready(timeout_s=120, models=["slow_load"])
                waited.append("ready")

        waiter = threading.Thread(target=wait)
        waiter.start()
        retried = []
        policy = RetryPolicy(max_attempts=1000, max_backoff_s=0.5, deadline_s=120)
        with Client(server.grpc_url, "grpc", retry=policy, on_retry=lambda n, e, d: retried.append(type(e))) as client:
            outputs = client.infer("slow_load", {"DELAY_MS": np.array([0], np.int32)})
        waiter.join(timeout=120)
        assert outputs["SUM"].shape == (0,) and waited == ["ready"]
        assert retried and set(retried) <= {ServerConnectionError, ModelNotReadyError}

        def repository(action):  # open connections would hold up Triton's shutdown: close them
            with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as admin:
                getattr(admin, action)("slow_load")

        repository("unload_model")
        loader = threading.Thread(target=repository, args=("load_model",))
        loader.start()
        reloading = []
        with Client(server.grpc_url, "grpc", retry=policy, on_retry=lambda n, e, d: reloading.append(type(e))) as client:
            deadline = time.monotonic() + 30
            while [v["state"] for v in client.versions("slow_load")] != ["LOADING"] and time.monotonic() < deadline:
                time.sleep(0.02)  # polling for a state, not timing anything
            outputs = client.infer("slow_load", {"DELAY_MS": np.array([0], np.int32)})
        loader.join(timeout=120)
        assert outputs["SUM"].shape == (0,) and ModelNotReadyError in reloading
    finally:
        server.stop()


def test_wait_ready_times_out_naming_what_is_missing(probe_server):
    with Client(probe_server.http_url) as client, pytest.raises(RequestTimeoutError, match="models not ready .*slow_load"):
        client.wait_ready(timeout_s=0.2, models=["slow_load"])


EXIT_WITHOUT_CLOSE = """
import asyncio, os, sys
import numpy as np
from fastpath_client import AsyncClient, Client
url, protocol, mode = sys.argv[1:4]
images = np.random.default_rng(7).integers(0, 256, (32, 128, 128, 3), dtype=np.uint8)  # 1.5 MB: shared memory
if mode == "sync":
    client = Client(url, protocol)
    client.infer("probe", {"IMAGES": images})
else:
    async def run():
        client = AsyncClient(url, protocol)
        await client.infer("probe", {"IMAGES": images})
        return client
    kept = asyncio.run(run())
print(os.getpid(), flush=True)
"""


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_never_closed_releases_its_regions_when_its_process_exits(probe_server, protocol, mode):
    """Invariant: a script that sends a large input through shared memory and exits without close() leaves no
    /dev/shm region of its process and none registered at the server (both stayed until Triton stopped)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, _url(probe_server, protocol), protocol, mode],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[0])
    assert leaked_regions(pid) == [] and _server_regions(probe_server) == []
