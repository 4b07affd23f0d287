"""The TensorRT runtime (TensorRT 10 Python API): plans built from (QDQ) ONNX, a CUDA graph per bucket.

Modules: ``loader`` (:func:`~fastpath.engines.tensorrt.loader.load`, the registry entry), ``runtime``
(:class:`~fastpath.engines.tensorrt.runtime.TensorRTEngine`), ``builder`` (plans, timing and plan caches),
``plan`` (profiles and cache keys, pure Python). The package imports without ``tensorrt`` and
cuda-python: they are imported only when a plan is built or run, raising
:class:`~fastpath.errors.EngineError` that names the missing package.
"""

from __future__ import annotations

from fastpath.engines.tensorrt.builder import EngineCache, build_serialized, require_tensorrt
from fastpath.engines.tensorrt.plan import PRECISION_FLAGS, PlanKey, Profile, bucket_profiles, builder_flags, plan_key

__all__ = [
    "PRECISION_FLAGS", "EngineCache", "PlanKey", "Profile", "bucket_profiles", "build_serialized",
    "builder_flags", "plan_key", "require_tensorrt",
]
