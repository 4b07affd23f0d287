"""The onnx-reference runtime's loader: ``load_engine("onnx-reference", path)`` once registered."""

from __future__ import annotations

from fastpath.engines.base import Engine
from tests.unit.engines.onnx_reference.engine import OnnxReferenceEngine


def load(path: str, *, verbose: int = 0) -> Engine:
    """Registry entry point.

    Args:
        path: an ``.onnx`` file.
        verbose: the reference evaluator's verbosity (0: silent).

    Raises:
        EngineError: the file is missing or not a loadable ONNX model.
    """
    return OnnxReferenceEngine(path, verbose=verbose)
