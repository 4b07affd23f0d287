"""What ScheduledModel checks at initialize, before any engine loads: config.pbtxt's tensors against the
model's (check_model_io), and the model's parameters against its own config classes (a parameter the
model does not use is refused by name)."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from fastpath.cli.common import DEFAULT_REPOSITORY
from fastpath.config import parse_sections, triton_parameters
from fastpath.errors import ConfigError
from fastpath.models.text_detection.model import TextDetectionModel
from fastpath.models.text_embedding.model import TextEmbeddingModel
from fastpath.triton.io import TensorSpec, check_model_io

MODELS = {"text_embedding": TextEmbeddingModel, "text_detection": TextDetectionModel}
SHIPPED = [(name, path) for name in MODELS for path in ("config.pbtxt", "configs/gpu.pbtxt")]


def triton_json(text: str) -> dict:
    """A config.pbtxt as Triton hands it to ``initialize`` (protobuf's JSON: int64 dims as strings)."""
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return json.loads(json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True)))


def shipped(name: str, path: str = "config.pbtxt") -> dict:
    return triton_json((DEFAULT_REPOSITORY / name / path).read_text())


@pytest.mark.parametrize(("name", "path"), SHIPPED)
def test_every_shipped_config_declares_the_models_tensors_and_only_its_parameters(name, path):
    """Invariant: each shipped config.pbtxt (CPU and GPU) passes the checks its model runs at initialize."""
    model = MODELS[name]
    config = shipped(name, path)
    check_model_io(config, model.INPUTS, model.OUTPUTS, model=name)
    model_config, sched = parse_sections(triton_parameters(config), model.CONFIG, model.SCHEDULER_CONFIG, model=name)
    assert sched.max_queue_items == getattr(sched, f"max_queue_{model.UNIT}") >= sched.batch_buckets[-1]


@pytest.mark.parametrize(("name", "key", "value"), [
    ("text_detection", "response_mode", "return"),
    ("text_detection", "inline_when_idle", "false"),
    ("text_detection", "max_queue_texts", "64"),
    ("text_embedding", "max_queue_images", "64"),
    ("text_embedding", "max_images_per_request", "4"),
])
def test_a_parameter_the_model_does_not_use_is_refused_by_name(name, key, value):
    """Invariant: a model loads only parameters it reads; another model's parameter is an error naming it and the model."""
    model = MODELS[name]
    parameters = {**triton_parameters(shipped(name)), key: value}
    with pytest.raises(ConfigError, match=rf"unknown config.pbtxt parameter '{key}' \({name} does not use it\); known parameters: "):
        parse_sections(parameters, model.CONFIG, model.SCHEDULER_CONFIG, model=name)


def _edit(config: dict, section: str, name: str, **changes) -> dict:
    for entry in config[section]:
        if entry["name"] == name:
            entry.update(changes)
    return config


@pytest.mark.parametrize(("change", "match"), [
    (lambda c: _edit(c, "output", "EMBEDDING", dims=["768"]),
     r"output 'EMBEDDING' of text_embedding is TYPE_FP32 dims \[768\]: expected TYPE_FP32 dims \[384\]"),
    (lambda c: _edit(c, "output", "TOKEN_COUNT", data_type="TYPE_INT64"),
     r"output 'TOKEN_COUNT' of text_embedding is TYPE_INT64 dims \[1\]: expected TYPE_INT32 dims \[1\]"),
    (lambda c: _edit(c, "input", "TEXT", optional=True),
     r"input 'TEXT' of text_embedding is TYPE_STRING dims \[1\] optional: expected TYPE_STRING dims \[1\] "),
    (lambda c: {**c, "output": [o for o in c["output"] if o["name"] != "MODEL_VERSION"]},
     r"outputs of text_embedding are \['EMBEDDING', 'TOKEN_COUNT', 'TRUNCATED'\]: expected "
     r"\['EMBEDDING', 'MODEL_VERSION', 'TOKEN_COUNT', 'TRUNCATED'\], the outputs the model writes"),
    (lambda c: {**c, "input": c["input"] + [{"name": "LANGUAGE", "data_type": "TYPE_STRING", "dims": ["1"]}]},
     r"inputs of text_embedding are \['LANGUAGE', 'TEXT'\]: expected \['TEXT'\], the inputs the model reads"),
])
def test_a_config_whose_tensors_are_not_the_models_is_refused_naming_tensor_value_and_expectation(change, match):
    """Invariant: config.pbtxt declares exactly the tensors the model reads and writes, each with the
    model's data type, rank, fixed sizes and optional flag; anything else fails at load, not at the first request."""
    model = TextEmbeddingModel
    with pytest.raises(ConfigError, match=match):
        check_model_io(change(shipped("text_embedding")), model.INPUTS, model.OUTPUTS, model="text_embedding")


def test_a_config_may_fix_a_size_the_model_leaves_open():
    """Invariant: -1 in the model's spec takes any size: a config that accepts only RGB images (C fixed to 3) loads."""
    config = _edit(shipped("text_detection"), "input", "IMAGE", dims=["-1", "-1", "-1", "3"])
    check_model_io(config, TextDetectionModel.INPUTS, TextDetectionModel.OUTPUTS, model="text_detection")
    with pytest.raises(ConfigError, match=r"input 'IMAGE' of text_detection is TYPE_UINT8 dims \[-1, -1, 3\] optional"):
        check_model_io(_edit(config, "input", "IMAGE", dims=[-1, -1, 3]), TextDetectionModel.INPUTS,
                       TextDetectionModel.OUTPUTS, model="text_detection")


def test_tensor_specs_compare_with_triton_json_dims_as_numbers_or_strings():
    """Triton's own JSON gives dims as numbers, protobuf's as strings: both read the same."""
    spec = (TensorSpec("X", "TYPE_FP32", (-1, 4)),)
    for dims in ([-1, 4], ["-1", "4"], [7, 4]):
        check_model_io({"input": [{"name": "X", "data_type": "TYPE_FP32", "dims": dims}]}, spec, (), model="m")
