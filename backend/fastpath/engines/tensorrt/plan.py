"""What a TensorRT engine is built for, computed without TensorRT: profiles and the cache key.

Kept free of ``tensorrt`` and CUDA imports so it is unit-tested on any machine.

- One optimization profile per bucket (min = opt = max = the bucket's [batch, length]): each
  bucket gets kernels tuned for exactly its shape and its own execution context, so every
  bucket's CUDA graph is captured once around ``execute_async_v3`` and never re-planned.
- The engine cache key is the sha256 of everything that makes a plan valid (TensorRT's plans are
  specific to the TensorRT version and the GPU model: TensorRT developer guide, "Engine
  compatibility"): the ONNX file's sha256, the GPU name and compute capability, the TensorRT
  version, the precision flags and the profiles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from fastpath.errors import ConfigError
from fastpath.graphs import Bucket, BucketGrid

# precision -> TensorRT BuilderFlag names to set (the network's QDQ nodes fix which layers run INT8/FP8)
PRECISION_FLAGS = {
    "fp32": (),
    "fp16": ("FP16",),
    "int8": ("INT8", "FP16"),
    "fp8": ("FP8", "FP16"),
}


@dataclasses.dataclass(frozen=True)
class Profile:
    """One optimization profile: the same min/opt/max shape for every input.

    Attributes:
        bucket: the bucket this profile serves.
        min_shape, opt_shape, max_shape: [batch, length] for each input tensor.
    """

    bucket: Bucket
    min_shape: tuple[int, int]
    opt_shape: tuple[int, int]
    max_shape: tuple[int, int]


def bucket_profiles(grid: BucketGrid) -> list[Profile]:
    """One exact-shape profile per bucket, in capture order (largest first)."""
    return [Profile(b, (b.batch, b.length), (b.batch, b.length), (b.batch, b.length)) for b in grid.capture_order()]


def builder_flags(precision: str) -> tuple[str, ...]:
    """TensorRT ``BuilderFlag`` names for a precision.

    Raises:
        ConfigError: unknown precision.
    """
    if precision not in PRECISION_FLAGS:
        raise ConfigError(f"TensorRT precision {precision!r} is not one of {', '.join(PRECISION_FLAGS)}")
    return PRECISION_FLAGS[precision]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanKey:
    """Everything a serialized TensorRT plan depends on.

    Attributes:
        onnx_sha256: sha256 of the ONNX file the plan is built from.
        gpu_name: e.g. ``"NVIDIA H200"``.
        compute_capability: e.g. ``(9, 0)``.
        tensorrt_version: e.g. ``"10.8.0"``.
        precision: ``fp32`` | ``fp16`` | ``int8`` | ``fp8``.
        buckets: the profiles' buckets.
    """

    onnx_sha256: str
    gpu_name: str
    compute_capability: tuple[int, int]
    tensorrt_version: str
    precision: str
    buckets: tuple[Bucket, ...]

    def digest(self) -> str:
        """Hex sha256 of the key's canonical JSON: the engine cache file name."""
        payload = dataclasses.asdict(self)
        payload["buckets"] = [[b.batch, b.length] for b in self.buckets]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def file_name(self) -> str:
        """``<precision>-<first 16 hex of the digest>.plan``."""
        return f"{self.precision}-{self.digest()[:16]}.plan"


def plan_key(*, onnx_sha256: str, gpu_name: str, compute_capability: Sequence[int], tensorrt_version: str, precision: str, grid: BucketGrid) -> PlanKey:
    """Build a :class:`PlanKey` (validates the precision)."""
    builder_flags(precision)
    return PlanKey(
        onnx_sha256=onnx_sha256,
        gpu_name=gpu_name,
        compute_capability=(int(compute_capability[0]), int(compute_capability[1])),
        tensorrt_version=tensorrt_version,
        precision=precision,
        buckets=tuple(grid.capture_order()),
    )
