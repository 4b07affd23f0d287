"""`fastpath serve --device cuda` serves every model: start it as a user would, call each model once, stop it.

Runs on the device machine after scripts/gpu_setup.sh (benchmarks/gpu/detection_gpu.sh runs it). Prints the
configuration lines `fastpath serve` logs, the time to ready, one text_embedding answer (shape, norm) and one
text_detection answer on a real photo (boxes), then stops the server with SIGINT, as Ctrl-C would.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--photo", type=Path, required=True, help="a JPEG or PNG with text")
    parser.add_argument("--ready-timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    import tritonclient.grpc as grpcclient

    from tests.conftest import free_ports

    http_port, grpc_port, metrics_port = free_ports(3)
    env = dict(os.environ, HTTP_PORT=str(http_port), GRPC_PORT=str(grpc_port), METRICS_PORT=str(metrics_port))
    started = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "fastpath", "serve", "--device", "cuda", "--host", "127.0.0.1"],
                              env=env, start_new_session=True, stdout=sys.stdout, stderr=subprocess.STDOUT)
    code = 1
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        while time.monotonic() - started < args.ready_timeout_s and server.poll() is None:
            try:
                if client.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.5)
        print(f"ready after {time.monotonic() - started:.1f} s: {client.is_server_ready()}", flush=True)
        text = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"A quick brown fox."], [b"Triton serves models."]], dtype=object))
        vectors = client.infer("text_embedding", [text]).as_numpy("EMBEDDING")
        print("text_embedding:", vectors.shape, "norms", np.round(np.linalg.norm(vectors, axis=1), 4).tolist(), flush=True)
        image = grpcclient.InferInput("IMAGE_BYTES", [1], "BYTES")
        image.set_data_from_numpy(np.array([args.photo.read_bytes()], dtype=object))
        result = client.infer("text_detection", [image])
        print("text_detection:", args.photo.name, "boxes", result.as_numpy("BOX_COUNTS").tolist(),
              "first", result.as_numpy("BOXES")[:1].tolist(), flush=True)
        code = 0
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
