"""The TensorRT runtime (TensorRT 10 Python API): plans built from (QDQ) ONNX, a CUDA graph per bucket.

This package imports without ``tensorrt`` and cuda-python: :mod:`.plan` (profiles, cache keys) is
pure Python, and :mod:`.builder` / :mod:`.runtime` import the libraries only when used, raising
:class:`~fastpath.errors.EngineError` that names the missing package.
"""

from __future__ import annotations

from fastpath.engines.tensorrt.builder import EngineCache, build_serialized, require_tensorrt
from fastpath.engines.tensorrt.plan import PRECISION_FLAGS, PlanKey, Profile, bucket_profiles, builder_flags, plan_key

__all__ = [
    "PRECISION_FLAGS", "EngineCache", "PlanKey", "Profile", "TensorRTEngine", "bucket_profiles", "build_serialized",
    "builder_flags", "plan_key", "require_tensorrt",
]


def __getattr__(name: str):
    if name == "TensorRTEngine":  # imported lazily: it is the entry point the engine registry names
        from fastpath.engines.tensorrt.runtime import TensorRTEngine

        return TensorRTEngine
    raise AttributeError(name)
