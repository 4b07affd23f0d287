"""The shipped GPU configuration of text_embedding, ``configs/gpu.pbtxt`` (what ``fastpath serve --device
cuda`` loads): Triton's schema parses it, FastPath's parameter parsing accepts it, its tensors and
version policy are config.pbtxt's, and it sets the GPU serving path."""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from fastpath.cli.common import DEFAULT_REPOSITORY
from fastpath.config import parse_sections, triton_parameters
from fastpath.errors import ConfigError
from fastpath.graphs import Bucket, BucketGrid
from fastpath.models.text_embedding.config import EmbeddingSchedulerConfig, TextEmbeddingConfig, placed_config
from fastpath.models.text_embedding.pipeline import engine_options, scheduler_grid

MODEL = DEFAULT_REPOSITORY / "text_embedding"


def load(path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def gpu():
    return load(MODEL / "configs" / "gpu.pbtxt")


@pytest.fixture(scope="module")
def cpu():
    return load(MODEL / "config.pbtxt")


def as_triton_json(config: model_config_pb2.ModelConfig) -> str:
    """The model config as Triton hands it to ``initialize`` (``args["model_config"]``)."""
    return json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))


def test_tensors_and_versions_are_those_of_config_pbtxt(gpu, cpu):
    for field in ("name", "backend", "max_batch_size", "input", "output", "version_policy"):
        assert getattr(gpu, field) == getattr(cpu, field), f"configs/gpu.pbtxt {field} differs from config.pbtxt"


def test_it_serves_from_gpu_instances_behind_a_200_us_wait_in_tritons_batcher(gpu):
    assert [(model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind), g.count, list(g.gpus)) for g in gpu.instance_group] == [
        ("KIND_GPU", 6, [])]
    assert gpu.HasField("dynamic_batching") and gpu.dynamic_batching.max_queue_delay_microseconds == 200


def test_fastpath_accepts_its_parameters_and_places_each_instance_on_its_gpu(gpu):
    parameters = triton_parameters(as_triton_json(gpu))
    config, sched = parse_sections(parameters, TextEmbeddingConfig, EmbeddingSchedulerConfig)
    assert (config.runtime, config.precision, config.artifact) == ("torch", "fp16", "model.fp16.safetensors")
    assert config.length_buckets_tokens == (16, 32, 64, 128, 256) and config.max_seq_length == 256
    assert sched.batch_buckets == (1, 2, 4, 8, 16, 32, 64) and sched.batch_buckets[-1] <= config.max_batch_texts
    assert sched.response_mode == "return"
    assert "device" not in parameters  # a KIND_GPU instance runs where Triton placed it
    for device_id in (0, 1):
        args = {"model_config": as_triton_json(gpu), "model_instance_kind": "GPU", "model_instance_device_id": str(device_id),
                "model_instance_name": f"text_embedding_0_{device_id}"}
        placed = placed_config(config, args)
        options = engine_options(placed)
        assert options["device"] == f"cuda:{device_id}"
        assert options["batch_sizes"] == (1, 2, 4, 8, 16, 32, 64) and options["lengths"] == (16, 32, 64, 128, 256)


class LoadedEngine(NamedTuple):
    """What ``scheduler_grid`` reads of a loaded engine: the shapes it captured (``Engine.buckets``)."""

    buckets: tuple[Bucket, ...]


def test_the_scheduler_batches_only_on_batch_sizes_the_gpu_engine_captured(gpu):
    """Invariant: every batch the scheduler forms runs on a captured CUDA graph as it is. batch_buckets must
    be a subset of the batch sizes the torch engine captures (engine_options: powers of two up to
    max_batch_texts); "1,3,6" would have the engine pad a batch of 3 again to 4 and is refused at load,
    naming the value and the captured sizes. An engine that captured nothing runs any size."""
    config, sched = parse_sections(triton_parameters(as_triton_json(gpu)), TextEmbeddingConfig, EmbeddingSchedulerConfig)
    args = {"model_config": as_triton_json(gpu), "model_instance_kind": "GPU", "model_instance_device_id": "0"}
    options = engine_options(placed_config(config, args))
    captured = LoadedEngine(BucketGrid(options["batch_sizes"], options["lengths"]).buckets)  # TorchEngine's graphs on a GPU
    grid = scheduler_grid(config, sched, captured)
    assert grid.batch_sizes == (1, 2, 4, 8, 16, 32, 64) and grid.lengths == (16, 32, 64, 128, 256)
    odd = dataclasses.replace(sched, batch_buckets=(1, 3, 6))
    with pytest.raises(ConfigError, match=r"'batch_buckets' = 1,3,6: 3, 6 are not among the sizes the engine captured "
                                          r"\(1,2,4,8,16,32,64\), so a batch of 3 would be padded again to 4"):
        scheduler_grid(config, odd, captured)
    assert scheduler_grid(config, odd, LoadedEngine(())).batch_sizes == (1, 3, 6)


def test_the_cpu_config_stays_on_the_cpu(cpu):
    assert {model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind) for g in cpu.instance_group} == {"KIND_CPU"}
    config, _ = parse_sections(triton_parameters(as_triton_json(cpu)), TextEmbeddingConfig, EmbeddingSchedulerConfig)
    assert config.runtime == "onnxruntime"


def test_text_detection_gpu_config_keeps_its_tensors_and_places_the_cuda_engine_on_the_assigned_gpu():
    """text_detection's configs/gpu.pbtxt: config.pbtxt's tensors and versions; KIND_GPU instances whose
    device is Triton's model_instance_device_id; exact shapes (no bucket padding, which moves boxes); the
    staging pool holds a largest batch's uint8 input and float32 maps; warm-up shapes parse; every shape runs on
    a session that only ever sees that shape (a graph session per captured shape, a graph-free session per other
    shape), since a session whose input shape changes rebuilds every convolution's cuDNN plan."""
    from fastpath.config import instance_device
    from fastpath.models.text_detection.config import DetectionSchedulerConfig, TextDetectionConfig

    model = DEFAULT_REPOSITORY / "text_detection"
    gpu, cpu = load(model / "configs" / "gpu.pbtxt"), load(model / "config.pbtxt")
    for field in ("name", "backend", "max_batch_size", "input", "output", "version_policy"):
        assert getattr(gpu, field) == getattr(cpu, field), f"text_detection configs/gpu.pbtxt {field} differs from config.pbtxt"
    assert [model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind) for g in gpu.instance_group] == ["KIND_GPU"]
    config, sched = parse_sections(triton_parameters(as_triton_json(gpu)), TextDetectionConfig, DetectionSchedulerConfig)
    assert config.bucket_sides_px == () and config.decode_threads > 0 and not config.cuda_tf32
    assert (736, 1312) in config.capture_shapes_hw
    assert config.cuda_graph_session_per_shape and config.cuda_eager_session_per_shape
    assert sched.batch_buckets[-1] <= config.max_batch_images
    largest_batch_bytes = sched.batch_buckets[-1] * config.largest_resized_pixels * (3 + 4)  # uint8 RGB in, float32 map out
    assert 2 * largest_batch_bytes <= config.staging_capacity_bytes
    args = {"model_instance_kind": "GPU", "model_instance_device_id": "1", "model_instance_name": "text_detection_0_1"}
    assert instance_device(args, None, runtime=config.runtime, gpu_runtimes=("onnxruntime",)) == "cuda:1"
