"""An ONNX graph run by onnx's numpy reference evaluator, behind the engine interface."""

from __future__ import annotations

import numpy as np

from fastpath.engines.base import Engine, TensorSpec
from fastpath.errors import EngineError


def _spec(value_info) -> TensorSpec:
    from onnx import helper

    tensor = value_info.type.tensor_type
    shape = tuple(dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor.shape.dim)
    return TensorSpec(value_info.name, np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)), shape)


class OnnxReferenceEngine(Engine):
    """``path``'s graph evaluated in numpy; inputs and outputs as the graph declares them.

    Raises:
        EngineError: the file is missing or not a loadable ONNX model.
    """

    name = "onnx-reference"

    def __init__(self, path: str, *, verbose: int = 0) -> None:
        import onnx
        from onnx.reference import ReferenceEvaluator

        try:
            model = onnx.load(path)
            self._evaluator: ReferenceEvaluator | None = ReferenceEvaluator(model, verbose=verbose)
        except Exception as exc:  # onnx raises OSError, protobuf's DecodeError and its checker's errors
            raise EngineError(f"the onnx reference evaluator could not load {path}: {exc}") from exc
        weights = {initializer.name for initializer in model.graph.initializer}
        self._inputs = tuple(_spec(value) for value in model.graph.input if value.name not in weights)
        self._outputs = tuple(_spec(value) for value in model.graph.output)

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._evaluator is None:
            raise EngineError("onnx-reference engine is closed")
        results = self._evaluator.run(None, {spec.name: feeds[spec.name] for spec in self._inputs})
        return {spec.name: np.asarray(value) for spec, value in zip(self._outputs, results)}

    @property
    def closed(self) -> bool:
        return self._evaluator is None

    def close(self) -> None:
        self._evaluator = None
