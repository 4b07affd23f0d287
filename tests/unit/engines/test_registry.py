"""The engine registry: one loader module per runtime, options checked against the loader, clear errors."""

import ast
from pathlib import Path

import numpy as np
import pytest

import fastpath.engines
from fastpath.engines import available_runtimes, load_engine, register_runtime
from fastpath.engines.base import Engine, TensorSpec
from fastpath.errors import ConfigError, EngineError
from tests.conftest import MODEL_REPOSITORY
from tests.unit.engines.tiny_graphs import dense_relu

FP32_ONNX = MODEL_REPOSITORY / "text_embedding" / "1" / "model.onnx"
ENGINES = Path(fastpath.engines.__file__).parent


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test (runtimes a test registers do not leak into others)."""
    monkeypatch.setattr(fastpath.engines, "_REGISTRY", dict(fastpath.engines._REGISTRY))


def test_every_runtime_is_registered():
    status = available_runtimes()
    assert set(status) >= {"onnxruntime", "torch", "tensorrt"}
    assert status["onnxruntime"] == "ok"  # tensorrt's module imports without TensorRT (it fails only when used)
    assert status["tensorrt"] == "ok"


def test_every_runtime_folder_has_a_loader_and_one_registry_line():
    """Invariant: each folder engines/<runtime>/ holds loader.py defining load(path, ...), and the registry
    names exactly those loader modules, one line each: one convention for every runtime."""
    folders = sorted(path.parent.name for path in ENGINES.glob("*/__init__.py"))
    for folder in folders:
        loader = ENGINES / folder / "loader.py"
        assert loader.is_file(), f"engines/{folder}/ has no loader.py"
        functions = {node.name: node for node in ast.parse(loader.read_text()).body if isinstance(node, ast.FunctionDef)}
        assert "load" in functions and functions["load"].args.args[0].arg == "path", f"engines/{folder}/loader.py has no load(path, ...)"
    registered = dict(fastpath.engines._REGISTRY)
    assert registered == {folder: f"fastpath.engines.{folder}.loader" for folder in folders}


def test_unknown_runtime_lists_the_known_ones():
    with pytest.raises(ConfigError, match="runtime 'tflite' is unknown; known runtimes: onnxruntime, tensorrt, torch"):
        load_engine("tflite", "model.tflite")


def test_unknown_option_is_named_with_the_runtime_options():
    with pytest.raises(ConfigError, match="runtime 'torch' does not take option 'thread'; its options: .*precision"):
        load_engine("torch", "model.fp16.safetensors", thread=2)


def test_onnxruntime_cpu_loads_the_fp32_artifact():
    with load_engine("onnxruntime", str(FP32_ONNX), intra_op_threads=1) as engine:
        assert [spec.name for spec in engine.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
        assert engine.buckets == ()  # any shape runs the same way on the CPU
        ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
        out = engine.infer({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})
        assert out["embedding"].shape == (1, 384) and abs(np.linalg.norm(out["embedding"]) - 1) < 1e-5


def test_onnxruntime_cuda_says_what_is_missing():
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here; this checks the message without it")
    with pytest.raises(EngineError, match="no CUDAExecutionProvider .* install onnxruntime-gpu"):
        load_engine("onnxruntime", str(FP32_ONNX), device="cuda")
    detector = MODEL_REPOSITORY / "text_detection" / "1" / "model.uint8.onnx"
    with pytest.raises(EngineError, match="no CUDAExecutionProvider .* install onnxruntime-gpu"):
        load_engine("onnxruntime", str(detector), device="cuda:0", layout="images", batch_sizes=(1, 2))
    with pytest.raises(ConfigError, match="'tpu' is not 'cpu' or 'cuda"):
        load_engine("onnxruntime", str(FP32_ONNX), device="tpu")
    with pytest.raises(ConfigError, match="onnxruntime layout 'pixels' is not one of tokens, images"):
        load_engine("onnxruntime", str(FP32_ONNX), device="cuda", layout="pixels")


class _Identity(Engine):
    """A real (trivial) engine: returns its input ids as floats."""

    def __init__(self, path: str, *, scale: float = 1.0) -> None:
        self.scale = scale

    @property
    def inputs(self):
        return (TensorSpec("x", np.dtype(np.int64), (-1,)),)

    @property
    def outputs(self):
        return (TensorSpec("y", np.dtype(np.float32), (-1,)),)

    def _infer(self, feeds):
        return {"y": feeds["x"].astype(np.float32) * self.scale}


def test_register_runtime_with_a_factory(registry):
    register_runtime("identity-test", _Identity)
    engine = load_engine("identity-test", "unused", scale=2.0)
    assert engine.infer({"x": np.array([1, 2])})["y"].tolist() == [2.0, 4.0]
    with pytest.raises(ConfigError, match="does not take option 'bias'"):
        load_engine("identity-test", "unused", bias=1)


def test_onnxruntime_lanes_give_the_main_sessions_results_and_name_a_missing_lane():
    """Engine lanes (concurrent_batches): extra sessions that run beside each other, same numerics."""
    import threading

    ids = np.array([[101, 7592, 2088, 102, 0], [101, 2178, 6251, 2003, 102]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64), "token_type_ids": np.zeros_like(ids)}
    with load_engine("onnxruntime", str(FP32_ONNX), lanes=2, lane_threads=1) as engine:
        assert engine.lanes == 2
        expected = engine.infer(feeds)["embedding"]
        results: dict[int, np.ndarray] = {}
        threads = [threading.Thread(target=lambda lane=lane: results.__setitem__(lane, engine.infer_lane(feeds, lane)["embedding"]))
                   for lane in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for lane in (0, 1):
            np.testing.assert_allclose(results[lane], expected, atol=1e-5)
        with pytest.raises(EngineError, match="has 2 lanes; lane 2 does not exist"):
            engine.infer_lane(feeds, 2)
    with load_engine("onnxruntime", str(FP32_ONNX), intra_op_threads=1) as engine:
        assert engine.lanes == 0
        with pytest.raises(EngineError, match="has 0 lanes; lane 0 does not exist"):
            engine.infer_lane(feeds, 0)
    with pytest.raises(EngineError, match="lanes must be >= 0 with >= 1 thread each, got 2 x 0"):
        load_engine("onnxruntime", str(FP32_ONNX), lanes=2, lane_threads=0)


def test_a_new_runtime_is_one_folder_and_one_registry_line(registry, tmp_path):
    """A runtime written the way the built-in ones are (tests/unit/engines/onnx_reference/: a loader and an
    engine evaluating ONNX in numpy) loads through load_engine after one registry line, and computes what
    numpy and the onnxruntime runtime compute on the same graph: relu(x @ W + b)."""
    register_runtime("onnx-reference", "tests.unit.engines.onnx_reference.loader")
    rng = np.random.default_rng(7)
    weight, bias = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    path = str(dense_relu(tmp_path / "dense.onnx", weight, bias))
    x = rng.standard_normal((5, 4)).astype(np.float32)
    assert available_runtimes()["onnx-reference"] == "ok"
    with load_engine("onnx-reference", path) as engine, load_engine("onnxruntime", path, intra_op_threads=1) as ort:
        assert engine.inputs == (TensorSpec("x", np.dtype(np.float32), (-1, 4)),)
        assert engine.outputs == (TensorSpec("y", np.dtype(np.float32), (-1, 3)),)
        y = engine.infer({"x": x})["y"]
        np.testing.assert_allclose(y, np.maximum(x @ weight + bias, 0), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(y, ort.infer({"x": x})["y"], rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match="runtime 'onnx-reference' does not take option 'device'; its options: verbose"):
        load_engine("onnx-reference", path, device="cuda")
    with pytest.raises(EngineError, match="could not load .*absent.onnx"):
        load_engine("onnx-reference", str(tmp_path / "absent.onnx"))


def test_a_loader_module_without_load_is_named(registry):
    """A registry line naming a module without load(path, **options) fails with ConfigError naming the module."""
    register_runtime("no-load", "fastpath.engines.base")
    with pytest.raises(ConfigError, match="runtime 'no-load': its loader module fastpath.engines.base has no load"):
        load_engine("no-load", "model.onnx")
