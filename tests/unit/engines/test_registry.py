"""The engine registry: runtimes by name, options checked against the loader, clear errors."""

import numpy as np
import pytest

from fastpath.engines import available_runtimes, load_engine, register_runtime
from fastpath.engines.base import Engine, TensorSpec
from fastpath.errors import ConfigError, EngineError
from tests.conftest import MODEL_REPOSITORY

FP32_ONNX = MODEL_REPOSITORY / "text_embedding" / "1" / "model.onnx"


def test_every_runtime_is_registered():
    status = available_runtimes()
    assert set(status) >= {"onnxruntime", "torch", "tensorrt"}
    assert status["onnxruntime"] == "ok"  # tensorrt's module imports without TensorRT (it fails only when used)
    assert status["tensorrt"] == "ok"


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
    with pytest.raises(ConfigError, match="'tpu' is not 'cpu' or 'cuda"):
        load_engine("onnxruntime", str(FP32_ONNX), device="tpu")


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

    def infer(self, feeds):
        return {"y": feeds["x"].astype(np.float32) * self.scale}


def test_register_runtime_with_a_factory():
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
