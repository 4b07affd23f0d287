"""Tiny ONNX graphs built with onnx.helper, one per behaviour an engine test needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

OPSET = 13


def _save(path: Path, nodes, inputs, outputs, initializers=()) -> Path:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # what onnxruntime >= 1.14 and onnx's reference evaluator both read
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def dense_relu(path: Path, weight: np.ndarray, bias: np.ndarray) -> Path:
    """``y = relu(x @ weight + bias)``: x float32 [batch, in] -> y float32 [batch, out]."""
    from onnx import TensorProto, helper, numpy_helper

    rows, cols = weight.shape
    return _save(
        path,
        [helper.make_node("MatMul", ["x", "weight"], ["xw"]), helper.make_node("Add", ["xw", "bias"], ["pre"]),
         helper.make_node("Relu", ["pre"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", cols])],
        [numpy_helper.from_array(weight.astype(np.float32), "weight"), numpy_helper.from_array(bias.astype(np.float32), "bias")],
    )


def masked(path: Path, width: int = 4) -> Path:
    """``y = x * mask``: two float32 inputs [batch, width] -> y float32 [batch, width]."""
    from onnx import TensorProto, helper

    return _save(
        path,
        [helper.make_node("Mul", ["x", "mask"], ["y"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width]) for name in ("x", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
    )


def batch_mean(path: Path, width: int = 4) -> Path:
    """``y = mean(x, axis 0)``: x float32 [batch, width] -> y float32 [1, width]; breaks the batch contract."""
    from onnx import TensorProto, helper

    return _save(
        path,
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
    )
