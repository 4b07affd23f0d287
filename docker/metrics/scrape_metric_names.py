"""Record the metric families a real Triton + FastPath server exports, for the dashboard and HPA checks.

Starts the tritonserver of the nvidia-pytriton wheel (Triton 2.51, the version of the docker image) on
free loopback ports with the flags docker/entrypoint.py adds (summary latencies on), loads
text_embedding and fastpath_admin, sends a few real requests so that lazily created families appear,
scrapes ``/metrics`` and writes every ``# TYPE`` line as JSON. tests/unit/test_deploy_files.py checks
that each PromQL query in docker/ names a family recorded here or registered in backend/fastpath.

    .venv/bin/python docker/metrics/scrape_metric_names.py   # rewrites docker/metrics/triton-metrics.json

GPU families (``nv_gpu_*``, ``nv_energy_consumption``) only appear where Triton sees a GPU; they are kept
in the JSON under "documented_gpu", copied from Triton's docs/user_guide/metrics.md, not scraped.
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

DOCKER_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = DOCKER_DIR.parent
OUTPUT = Path(__file__).with_name("triton-metrics.json")
DOCUMENTED_GPU = {
    "nv_gpu_power_usage": "gauge",
    "nv_gpu_power_limit": "gauge",
    "nv_energy_consumption": "counter",
    "nv_gpu_utilization": "gauge",
    "nv_gpu_memory_total_bytes": "gauge",
    "nv_gpu_memory_used_bytes": "gauge",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape() -> dict[str, object]:
    """Run the server, send traffic, return {"triton_version", "scraped": {family: type}, ...}."""
    sys.path.insert(0, str(DOCKER_DIR))
    import tritonclient.http as httpclient
    from entrypoint import DEFAULT_TRITON_ARGS

    from fastpath.server.process import ServerOptions, TritonServer

    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    options = ServerOptions(model_repository=REPO_ROOT / "model_repository", http_port=http, grpc_port=grpc,
                            metrics_port=metrics, host="127.0.0.1", admin_key="scrape-" + "k" * 16,
                            extra_args=DEFAULT_TRITON_ARGS)
    with tempfile.TemporaryDirectory() as logs, TritonServer(options, log_path=Path(logs) / "triton.log") as server:
        server.wait_ready(timeout_s=300)
        client = httpclient.InferenceServerClient(server.http_url)
        text = httpclient.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([["A quick brown fox."], ["Triton serves models."]], dtype=object))
        for _ in range(3):
            client.infer("text_embedding", [text])
        version = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2", timeout=5).read())["version"]
        page = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, flags=re.MULTILINE))
    return {
        "triton_version": version,
        "scraped_on": datetime.date.today().isoformat(),
        "how": "docker/metrics/scrape_metric_names.py: tritonserver from nvidia-pytriton, models text_embedding "
               "and fastpath_admin, flags " + " ".join(DEFAULT_TRITON_ARGS) + ", CPU only",
        "scraped": dict(sorted(families.items())),
        "documented_gpu": DOCUMENTED_GPU,
        "documented_gpu_source": "triton-inference-server/server docs/user_guide/metrics.md, 'GPU Metrics'",
    }


def main() -> None:
    record = scrape()
    OUTPUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {OUTPUT}: Triton {record['triton_version']}, {len(record['scraped'])} families")


if __name__ == "__main__":
    main()
