"""Where a model instance runs: Triton's KIND_GPU placement, else the ``device`` parameter.

The ``args`` dicts are the ones Triton 2.51's python backend passes ``initialize`` (keys and value
forms as a probe model logged them: ``model_instance_kind`` "CPU" for KIND_CPU and for KIND_AUTO on a
machine without GPUs, ``model_instance_device_id`` a decimal string).
"""

from __future__ import annotations

import json
from unittest import mock

import pytest

from fastpath.config import instance_device
from fastpath.errors import ConfigError
from fastpath.memory import allocators, create_host_pool, cuda_ordinal
from fastpath.memory.cuda import CudaProbe
from fastpath.models.text_embedding.config import GPU_RUNTIMES, TextEmbeddingConfig, placed_config


def triton_args(kind: str, device_id: int = 0, parameters: dict[str, str] | None = None, name: str = "text_embedding") -> dict[str, str]:
    config = {"name": name, "parameters": {key: {"string_value": value} for key, value in (parameters or {}).items()}}
    return {"model_config": json.dumps(config), "model_instance_kind": kind, "model_instance_name": f"{name}_0_{device_id}",
            "model_instance_device_id": str(device_id), "model_repository": f"/models/{name}", "model_version": "1",
            "model_name": name}


def place(kind: str, device_id: int, device: str | None, runtime: str = "torch") -> str:
    return instance_device(triton_args(kind, device_id), device, runtime=runtime, gpu_runtimes=GPU_RUNTIMES)


@pytest.mark.parametrize("device_id", [0, 1])
@pytest.mark.parametrize("written", [None, "cuda"])
def test_a_gpu_instance_runs_on_the_gpu_triton_assigned(device_id, written):
    assert place("GPU", device_id, written) == f"cuda:{device_id}"


@pytest.mark.parametrize("device_id", [0, 1])
def test_a_gpu_instance_may_name_its_own_gpu(device_id):
    assert place("GPU", device_id, f"cuda:{device_id}") == f"cuda:{device_id}"


def test_a_device_parameter_naming_another_gpu_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"parameter 'device' = 'cuda:1' contradicts instance_group kind KIND_GPU, which "
                                          r"placed text_embedding_0_0 on cuda:0: expected .*gpus: \[N\]"):
        place("GPU", 0, "cuda:1")
    with pytest.raises(ConfigError, match="'device' = 'cuda:0'.*on cuda:1"):
        place("GPU", 1, "cuda:0")


def test_device_cpu_on_a_gpu_instance_is_refused():
    with pytest.raises(ConfigError, match="'device' = 'cpu' contradicts instance_group kind KIND_GPU.*KIND_CPU to run on 'cpu'"):
        place("GPU", 0, "cpu")


@pytest.mark.parametrize("device_id", [0, 1])
def test_a_runtime_without_a_gpu_engine_on_a_gpu_instance_is_refused(device_id):
    with pytest.raises(ConfigError, match=rf"parameter 'runtime' = 'onnxruntime': instance_group kind KIND_GPU placed "
                                          rf"text_embedding_0_{device_id} on cuda:{device_id}.*expected runtime one of torch "
                                          r"with KIND_GPU, or instance_group kind KIND_CPU"):
        place("GPU", device_id, None, runtime="onnxruntime")


def test_a_model_without_a_gpu_engine_refuses_every_gpu_instance():
    with pytest.raises(ConfigError, match="'runtime' = 'onnxruntime'.*expected instance_group kind KIND_CPU \\(this model has no GPU engine\\)"):
        instance_device(triton_args("GPU", 0, name="text_detection"), None, runtime="onnxruntime", gpu_runtimes=())


@pytest.mark.parametrize("device_id", ["", "x", "-1"])
def test_a_gpu_instance_without_a_device_ordinal_is_refused(device_id):
    args = triton_args("GPU") | {"model_instance_device_id": device_id}
    with pytest.raises(ConfigError, match=f"model_instance_device_id = '{device_id}' for a KIND_GPU instance: expected a GPU ordinal"):
        instance_device(args, None, runtime="torch", gpu_runtimes=GPU_RUNTIMES)


# KIND_CPU, and KIND_AUTO, which Triton resolves before the model sees it ("CPU" without GPUs);
# "MODEL" (KIND_MODEL: the model places itself) and a missing kind behave the same.
@pytest.mark.parametrize("kind", ["CPU", "MODEL", "AUTO", None])
@pytest.mark.parametrize("device_id", [0, 1])
@pytest.mark.parametrize(("written", "expected"), [(None, "cpu"), ("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1")])
def test_other_kinds_keep_the_device_parameter(kind, device_id, written, expected):
    args = triton_args(kind or "CPU", device_id)
    if kind is None:
        del args["model_instance_kind"]
    assert instance_device(args, written, runtime="torch", gpu_runtimes=GPU_RUNTIMES) == expected
    # the CPU engine keeps running on a KIND_CPU instance: no GPU check applies there
    assert instance_device(args, written, runtime="onnxruntime", gpu_runtimes=()) == expected


def test_the_kind_is_matched_whatever_its_case():
    assert place("gpu", 1, None) == "cuda:1"


def test_placed_config_reads_the_device_as_written_in_the_model_config():
    gpu = triton_args("GPU", 1, {"runtime": "torch", "precision": "fp16"})
    config = placed_config(TextEmbeddingConfig(runtime="torch", precision="fp16"), gpu)
    assert config.device == "cuda:1" and config.runtime == "torch"
    # the parsed default "cpu" is not a written "cpu": only a written one contradicts KIND_GPU
    written_cpu = triton_args("GPU", 1, {"runtime": "torch", "device": "cpu"})
    with pytest.raises(ConfigError, match="'device' = 'cpu' contradicts"):
        placed_config(TextEmbeddingConfig(runtime="torch"), written_cpu)
    cpu = triton_args("CPU", 0, {"device": "cuda:1"})
    assert placed_config(TextEmbeddingConfig(runtime="torch", device="cuda:1"), cpu).device == "cuda:1"
    assert placed_config(TextEmbeddingConfig(), triton_args("CPU", 0)).device == "cpu"


def test_placed_config_refuses_the_cpu_engine_on_a_gpu_instance():
    with pytest.raises(ConfigError, match="'runtime' = 'onnxruntime'"):
        placed_config(TextEmbeddingConfig(), triton_args("GPU", 0))


@pytest.mark.parametrize(("device", "ordinal"), [(None, None), ("cpu", None), ("cuda", None), ("cuda:0", 0), ("cuda:1", 1)])
def test_cuda_ordinal(device, ordinal):
    assert cuda_ordinal(device) == ordinal


def test_cuda_ordinal_refuses_a_malformed_index():
    with pytest.raises(ValueError, match="device 'cuda:x': expected cpu, cuda or cuda:N"):
        cuda_ordinal("cuda:x")


class FakeRuntime:
    """The cuda.bindings runtime calls the pinned allocator makes, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.cudaHostAllocPortable = 1
        self._memory = bytearray(1 << 16)

    def cudaSetDevice(self, device):
        self.calls.append(("cudaSetDevice", device))
        return (0,)

    def cudaHostAlloc(self, nbytes, flags):
        import ctypes

        self.calls.append(("cudaHostAlloc", nbytes))
        return 0, ctypes.addressof((ctypes.c_char * len(self._memory)).from_buffer(self._memory))

    def cudaFreeHost(self, address):
        self.calls.append(("cudaFreeHost",))
        return (0,)


@pytest.mark.parametrize(("device", "expected"), [("cuda:1", [("cudaSetDevice", 1)]), ("cuda", []), ("cpu", [])])
def test_the_staging_pool_allocates_from_the_engines_device(device, expected):
    fake = FakeRuntime()
    with mock.patch.object(allocators, "probe_cuda", return_value=CudaProbe(True, 2, "GPU", "2 CUDA device(s)")), \
            mock.patch.object(allocators, "runtime", return_value=fake):
        pool = create_host_pool(name="staging", device=device)
        assert pool.allocator.name == "cuda-pinned"
        block = pool.allocator.allocate(4096)
        pool.allocator.free(block)
    assert fake.calls == [*expected, ("cudaHostAlloc", 4096), *expected, ("cudaFreeHost",)]
