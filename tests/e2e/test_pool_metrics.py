"""Pool statistics as Triton custom metrics, scraped from a real tritonserver's /metrics endpoint.

A throwaway python-backend model leases from a FastPath host pool and exports it with
``fastpath.triton.pool_metrics.PoolMetrics``; exhaustion reaches the client as a retryable
UNAVAILABLE error, never as a success.
"""

from __future__ import annotations

import re
import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server

pytestmark = pytest.mark.e2e
MODEL = "pool_probe"
CONFIG = """
name: "pool_probe"
backend: "python"
max_batch_size: 0
input [ { name: "NBYTES" data_type: TYPE_INT64 dims: [ 2 ] } ]
output [ { name: "PATTERN_SUM" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

from fastpath.memory import PoolConfig, create_host_pool
from fastpath.triton.io import error_response
from fastpath.triton.pool_metrics import PoolMetrics


class TritonPythonModel:
    def initialize(self, args):
        config = PoolConfig(capacity_bytes=1 << 20, max_block_bytes=1 << 20, wait_timeout_s=0.0)
        self.pool = create_host_pool(config, name="host")
        self.metrics = PoolMetrics(pb_utils, model=args["model_name"], pools=[self.pool])
        self.held = []

    def execute(self, requests):
        responses = []
        for request in requests:
            nbytes, keep = pb_utils.get_input_tensor_by_name(request, "NBYTES").as_numpy().tolist()
            try:
                lease = self.pool.lease(nbytes)
                view = lease.view(np.uint8, nbytes)
                view[:] = 1
                total = int(view.sum(dtype=np.int64))
                (self.held.append(lease) if keep else lease.release())
                out = pb_utils.Tensor("PATTERN_SUM", np.array([total], dtype=np.int64))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            except Exception as exc:
                responses.append(error_response(pb_utils, exc))
            self.metrics.update()
        return responses

    def finalize(self):
        for lease in self.held:
            lease.release()
        self.pool.close()
'''


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool_metrics")
    (root / "repo" / MODEL / "1").mkdir(parents=True)
    (root / "repo" / MODEL / "config.pbtxt").write_text(CONFIG)
    (root / "repo" / MODEL / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    server = start_server(root, models=(MODEL,), repository=root / "repo")
    try:
        yield server
    finally:
        server.stop()


def _lease(server, nbytes, keep):
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("NBYTES", [2], "INT64")
    tensor.set_data_from_numpy(np.array([nbytes, keep], dtype=np.int64))
    return int(client.infer(MODEL, [tensor]).as_numpy("PATTERN_SUM")[0])


def _metrics(server):
    url = f"http://127.0.0.1:{server.options.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    values = {}
    for name, labels, value in re.findall(r"^(fastpath_pool_\w+)\{([^}]*)\} (\S+)$", text, flags=re.M):
        assert 'model="pool_probe"' in labels and 'pool="host"' in labels and 'allocator="page-aligned"' in labels
        values[name] = float(value)
    return values


def test_pool_statistics_are_triton_metrics_and_exhaustion_is_retryable(probe_server):
    assert _lease(probe_server, 5000, keep=0) == 5000
    assert _lease(probe_server, 300_000, keep=1) == 300_000
    metrics = _metrics(probe_server)
    assert metrics["fastpath_pool_capacity_bytes"] == 1 << 20
    assert metrics["fastpath_pool_bytes_in_use"] == 512 * 1024
    assert metrics["fastpath_pool_bytes_reserved"] == 512 * 1024 + 8192
    assert metrics["fastpath_pool_outstanding_leases"] == 1
    assert metrics["fastpath_pool_pinned"] == 0
    assert (metrics["fastpath_pool_leases_total"], metrics["fastpath_pool_misses_total"]) == (2, 2)

    with pytest.raises(InferenceServerException, match="host pool .* exhausted") as info:
        _lease(probe_server, 1 << 20, keep=0)
    assert info.value.status() == "503"  # HTTP 503 Service Unavailable: clients retry
    metrics = _metrics(probe_server)
    assert metrics["fastpath_pool_exhausted_total"] == 1 and metrics["fastpath_pool_waits_total"] == 1
    assert metrics["fastpath_pool_bytes_in_use"] == 512 * 1024  # the failed lease took nothing
