"""Engines: one module per runtime behind one interface (:class:`fastpath.engines.base.Engine`).

Modeled on Polygraphy's loader/runner split: a runtime's loader turns an artifact into an engine;
the engine warms up, runs batches (``infer``), reports its buckets and is released by its owner
(``close``, idempotent). Runtimes are found through a registry of import paths, so a runtime's
library (torch, tensorrt, onnxruntime-gpu) is imported only when that runtime is asked for.

=============  ===========================================  ==========================================
runtime        artifact                                     loader options
=============  ===========================================  ==========================================
onnxruntime    ``model.onnx`` (fp32 or INT8 QDQ)            ``device`` ("cpu" | "cuda"), ``intra_op_threads``,
                                                            ``memory_pattern``, ``arena_max_input_bytes`` (CPU),
                                                            ``batch_sizes``/``lengths`` (CUDA graphs)
torch          ``model.fp16.safetensors``                   ``device``, ``precision``, ``batch_sizes``, ``lengths``
tensorrt       ``model.onnx`` (built into a cached plan)    ``precision``, ``batch_sizes``, ``lengths``, ``cache_dir``
=============  ===========================================  ==========================================
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from fastpath.engines.base import Engine, TensorSpec
from fastpath.errors import ConfigError

__all__ = ["Engine", "TensorSpec", "available_runtimes", "load_engine", "register_runtime"]

EngineFactory = Callable[..., Engine]

# runtime name -> "module:function" loaded on first use
_REGISTRY: dict[str, str | EngineFactory] = {
    "onnxruntime": "fastpath.engines.onnxruntime.loader:load",
    "torch": "fastpath.engines.torch:TorchEngine",
    "tensorrt": "fastpath.engines.tensorrt.runtime:TensorRTEngine",
}


def register_runtime(name: str, factory: str | EngineFactory) -> None:
    """Add or replace a runtime: ``factory(artifact_path, **options) -> Engine`` or its ``"module:function"``."""
    _REGISTRY[name] = factory


def _factory(runtime: str) -> EngineFactory:
    entry = _REGISTRY.get(runtime)
    if entry is None:
        raise ConfigError(f"runtime {runtime!r} is unknown; known runtimes: {', '.join(sorted(_REGISTRY))}")
    if callable(entry):
        return entry
    module_name, _, function = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"runtime {runtime!r} cannot be imported here: {exc}; install its package or choose another runtime") from exc
    return getattr(module, function)


def available_runtimes() -> dict[str, str]:
    """Each registered runtime and whether it imports here: ``"ok"`` or the import error."""
    status = {}
    for name in sorted(_REGISTRY):
        try:
            _factory(name)
            status[name] = "ok"
        except ConfigError as exc:
            status[name] = str(exc)
    return status


def load_engine(runtime: str, artifact_path: str, **options) -> Engine:
    """Load ``artifact_path`` with the named runtime.

    Args:
        runtime: a registered runtime name (``onnxruntime``, ``torch``, ``tensorrt``).
        artifact_path: the artifact file (see the table in this module's docstring).
        **options: runtime options, e.g. ``intra_op_threads`` for ONNX Runtime.

    Raises:
        fastpath.errors.ConfigError: unknown runtime, a runtime whose library is missing, or an
            option the runtime does not take.
        fastpath.errors.EngineError: the artifact does not load.
    """
    factory = _factory(runtime)
    parameters = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        unknown = sorted(set(options) - set(parameters))
        if unknown:
            known = sorted(name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
            raise ConfigError(f"runtime {runtime!r} does not take option {unknown[0]!r}; its options: {', '.join(known)}")
    return factory(artifact_path, **options)
