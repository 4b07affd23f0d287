"""Triton 2.51's custom model configuration, which `fastpath serve --device cuda` relies on: with
``--model-config-name=gpu`` a model with ``configs/gpu.pbtxt`` loads that file, one without it loads
its ``config.pbtxt``, and either way the model's directory (``args["model_repository"]``, where the
serving-version record lives) is the same. On a machine without GPUs, Triton refuses the shipped
KIND_GPU configuration of text_embedding, which is why `fastpath serve --device cuda` checks first."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from fastpath.cli.common import DEFAULT_REPOSITORY
from fastpath.errors import ServerError
from fastpath.server.process import ServerOptions, TritonServer
from fastpath.swaps.record import RECORD_NAME
from tests.conftest import free_ports

pytestmark = pytest.mark.e2e

# Answers with the initialize() arguments Triton gave its instance (model_config left out).
ARGS_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = {key: value for key, value in args.items() if key != "model_config"}
        self.args["parameters"] = json.loads(args["model_config"]).get("parameters", {})

    def execute(self, requests):
        answer = np.array([json.dumps(self.args).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", answer)]) for _ in requests]
'''

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: {kind} count: {count} }} ]
parameters {{ key: "config" value: {{ string_value: "{which}" }} }}
'''


def write_repository(root: Path) -> Path:
    """``custom`` (config.pbtxt: 1 instance; configs/gpu.pbtxt: 2 instances) and ``plain`` (config.pbtxt only)."""
    for name in ("custom", "plain"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(ARGS_MODEL)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, kind="KIND_CPU", count=1, which="config.pbtxt"))
    (root / "custom" / "configs").mkdir()
    (root / "custom" / "configs" / "gpu.pbtxt").write_text(CONFIG.format(name="custom", kind="KIND_CPU", count=2, which="gpu"))
    return root


def start(tmp_path: Path, repository: Path, models: tuple[str, ...]) -> TritonServer:
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(model_repository=repository, models=models, http_port=http_port, grpc_port=grpc_port,
                            metrics_port=metrics_port, host="127.0.0.1", exit_timeout_s=5, model_config_name="gpu")
    return TritonServer(options, log_path=tmp_path / "tritonserver.log").start()


def instance_args(server: TritonServer, model: str) -> dict:
    with httpclient.InferenceServerClient(server.http_url) as client:
        value = httpclient.InferInput("IN", [1], "INT32")
        value.set_data_from_numpy(np.array([1], dtype=np.int32))
        return json.loads(client.infer(model, [value]).as_numpy("ARGS")[0])


def test_a_model_with_configs_gpu_pbtxt_loads_it_and_one_without_loads_config_pbtxt(tmp_path):
    repository = write_repository(tmp_path / "repository")
    server = start(tmp_path, repository, ("custom", "plain"))
    try:
        server.wait_ready(timeout_s=120)
        api = server.api()
        custom, plain = api.config("custom", "1"), api.config("plain", "1")
        assert [g["count"] for g in custom["instance_group"]] == [2]
        assert custom["parameters"]["config"]["string_value"] == "gpu"
        assert [g["count"] for g in plain["instance_group"]] == [1]
        assert plain["parameters"]["config"]["string_value"] == "config.pbtxt"
        for model in ("custom", "plain"):
            args = instance_args(server, model)
            # the model's directory, not configs/: the serving-version record stays beside config.pbtxt
            assert args["model_repository"] == str(repository / model)
            assert Path(args["model_repository"]) / RECORD_NAME == repository / model / RECORD_NAME
            assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
        # a reload (stub supervision, the repository API) reads the same file again
        assert api.reload("custom")
        assert [g["count"] for g in api.config("custom", "1")["instance_group"]] == [2]
    finally:
        server.stop()


def test_without_gpus_triton_refuses_the_kind_gpu_configuration_of_text_embedding(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: cannot tell whether this machine has a GPU")
    if torch.cuda.is_available():
        pytest.skip(f"this machine has a CUDA device ({torch.cuda.get_device_name(0)}): the KIND_GPU config would load")
    server = start(tmp_path, DEFAULT_REPOSITORY, ("text_embedding",))
    try:
        with pytest.raises(ServerError, match="exited with code 1 before becoming ready"):
            server.wait_ready(timeout_s=120)
    finally:
        server.stop()
    assert ("instance group text_embedding_0 of model text_embedding has kind KIND_GPU but no GPUs are available"
            in (tmp_path / "tritonserver.log").read_text())
