"""Engines: one folder per runtime behind one interface (:class:`fastpath.engines.base.Engine`).

Modeled on Polygraphy's loader/runner split. Each runtime is a folder ``engines/<runtime>/`` holding
a ``loader.py``, whose ``load(path, **options) -> Engine`` turns an artifact into an engine, and its
engine module(s); the engine warms up, runs batches (``infer``, checked in one place by the base
class), reports its buckets and is released by its owner (``close``, idempotent). The registry below
names each runtime's loader module, so a runtime's library (torch, tensorrt, onnxruntime-gpu) is
imported only when that runtime is asked for. A new runtime is one new folder plus one registry line.

=============  ===========================================  ==========================================
runtime        artifact                                     loader options
=============  ===========================================  ==========================================
onnxruntime    ``model.onnx`` (fp32 or INT8 QDQ);           ``device`` ("cpu" | "cuda[:N]"), ``intra_op_threads``,
               ``model.uint8.onnx`` (``layout="images"``)   ``memory_pattern``, ``arena_max_input_bytes``, ``lanes`` (CPU);
                                                            ``layout`` ("tokens" | "images"), ``batch_sizes``,
                                                            ``lengths``, ``max_graphs``, ``tf32`` (CUDA graphs)
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

# runtime name -> its loader module (whose ``load`` is the factory), imported on first use
_REGISTRY: dict[str, str | EngineFactory] = {
    "onnxruntime": "fastpath.engines.onnxruntime.loader",
    "torch": "fastpath.engines.torch.loader",
    "tensorrt": "fastpath.engines.tensorrt.loader",
}


def register_runtime(name: str, loader: str | EngineFactory) -> None:
    """Add or replace a runtime.

    Args:
        name: the runtime name ``load_engine`` takes.
        loader: the import path of a loader module whose ``load(artifact_path, **options) -> Engine``
            loads it (the convention of the built-in runtimes), or that function itself.
    """
    _REGISTRY[name] = loader


def _factory(runtime: str) -> EngineFactory:
    entry = _REGISTRY.get(runtime)
    if entry is None:
        raise ConfigError(f"runtime {runtime!r} is unknown; known runtimes: {', '.join(sorted(_REGISTRY))}")
    if callable(entry):
        return entry
    try:
        module = importlib.import_module(entry)
    except ImportError as exc:
        raise ConfigError(f"runtime {runtime!r} cannot be imported here: {exc}; install its package or choose another runtime") from exc
    load = getattr(module, "load", None)
    if not callable(load):
        raise ConfigError(f"runtime {runtime!r}: its loader module {entry} has no load(path, **options) function")
    return load


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
