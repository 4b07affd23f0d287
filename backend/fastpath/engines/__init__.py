"""Engines: one module per runtime behind one interface (:class:`fastpath.engines.base.Engine`).

Modeled on Polygraphy's loader/runner split: a runtime module loads an artifact into an engine;
the engine runs batches (``infer``) and is released by its owner (``close``, idempotent).
"""

from fastpath.engines.base import Engine, TensorSpec

__all__ = ["Engine", "TensorSpec", "load_engine"]


def load_engine(runtime: str, artifact_path: str, **options) -> Engine:
    """Load ``artifact_path`` with the named runtime.

    Args:
        runtime: ``"onnxruntime"`` (others arrive with the engines issue).
        artifact_path: path to the ONNX file.
        **options: runtime options, e.g. ``intra_op_threads`` for ONNX Runtime.

    Raises:
        fastpath.errors.ConfigError: unknown runtime.
        fastpath.errors.EngineError: the artifact does not load.
    """
    from fastpath.errors import ConfigError

    if runtime == "onnxruntime":
        from fastpath.engines.onnxruntime import OnnxRuntimeEngine

        return OnnxRuntimeEngine(artifact_path, **options)
    raise ConfigError(f"runtime {runtime!r} is not available in this build; use 'onnxruntime'")
