"""ONNX Runtime engine (CPU execution provider by default).

ONNX Runtime releases the GIL inside ``InferenceSession.run``, so a worker thread can run a batch
while the Python thread that feeds it tokenizes the next one.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from fastpath.engines.base import Engine, TensorSpec
from fastpath.errors import EngineError

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
}


def _spec(node: ort.NodeArg) -> TensorSpec:
    shape = tuple(dim if isinstance(dim, int) else -1 for dim in node.shape)
    return TensorSpec(node.name, np.dtype(_ORT_TYPES.get(node.type, np.float32)), shape)


class OnnxRuntimeEngine(Engine):
    """An ONNX model in an ONNX Runtime ``InferenceSession``.

    Args:
        path: the ``.onnx`` file.
        intra_op_threads: threads per operator; 0 lets ONNX Runtime use one per physical core.
        providers: execution providers in priority order (default: CPU only).

    Raises:
        EngineError: the file is missing or not a loadable ONNX model.
    """

    name = "onnxruntime"

    def __init__(self, path: str, *, intra_op_threads: int = 0, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self._session: ort.InferenceSession | None = ort.InferenceSession(path, options, providers=list(providers))
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/NoSuchFile types
            raise EngineError(f"ONNX Runtime could not load {path}: {exc}") from exc
        self._inputs = tuple(_spec(n) for n in self._session.get_inputs())
        self._outputs = tuple(_spec(n) for n in self._session.get_outputs())

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._session is None:
            raise EngineError("ONNX Runtime engine is closed")
        wanted = {spec.name for spec in self._inputs}
        try:
            results = self._session.run(None, {k: v for k, v in feeds.items() if k in wanted})
        except Exception as exc:
            raise EngineError(f"ONNX Runtime failed on a batch of shape {next(iter(feeds.values())).shape}: {exc}") from exc
        return {spec.name: value for spec, value in zip(self._outputs, results)}

    def close(self) -> None:
        self._session = None
