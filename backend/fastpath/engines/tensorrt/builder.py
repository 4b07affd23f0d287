"""Building TensorRT plans from ONNX (TensorRT 10 Python API), with a timing cache and an engine cache.

Written to the TensorRT 10 documentation ("Python API", "Optimization Profiles", "Timing Cache",
"Explicit Quantization"). The unit tests cover the parts that need no ``tensorrt``; the rest
needs a machine with TensorRT installed.

- The network comes from ``trt.OnnxParser``; an INT8 QDQ ONNX (from ``fastpath build``) is an
  explicitly quantized network: its Q/DQ nodes decide which layers run in INT8, and the INT8 and
  FP16 builder flags let TensorRT pick the fastest kernels for the rest.
- One exact-shape optimization profile per bucket (:func:`~fastpath.engines.tensorrt.plan.bucket_profiles`).
- The timing cache file is loaded before and saved after each build, so rebuilding for another
  bucket list or precision reuses measured tactics.
- :class:`EngineCache` stores plans under the :class:`~fastpath.engines.tensorrt.plan.PlanKey`
  digest (ONNX sha256 + GPU + TensorRT version + precision + buckets); a stale plan is never loaded.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastpath.engines.tensorrt.plan import PlanKey, bucket_profiles, builder_flags
from fastpath.errors import EngineError
from fastpath.graphs import BucketGrid
from fastpath.manifest import give_default_mode

LOG = logging.getLogger("fastpath.engines.tensorrt")


def require_tensorrt() -> Any:
    """Import ``tensorrt`` (10.x) or explain what is missing.

    Raises:
        EngineError: the package is not installed, or its major version is not 10.
    """
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise EngineError(
            f"the TensorRT runtime needs the 'tensorrt' Python package (TensorRT 10.x, e.g. 'pip install tensorrt-cu12'), "
            f"which is not installed here ({exc}); use runtime 'torch' or 'onnxruntime' instead"
        ) from None
    if not trt.__version__.startswith("10."):
        raise EngineError(f"tensorrt {trt.__version__} is installed; FastPath's TensorRT runtime is written for TensorRT 10.x")
    return trt


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        handle.write(data)
        temporary = Path(handle.name)
    give_default_mode(temporary)  # NamedTemporaryFile makes it 0o600
    os.replace(temporary, path)


def build_serialized(onnx_path: Path, grid: BucketGrid, precision: str, *, timing_cache_path: Path | None = None,
                     workspace_bytes: int = 4 << 30) -> bytes:
    """Build a serialized TensorRT plan for ``onnx_path`` with one profile per bucket.

    Args:
        onnx_path: fp32 or INT8 QDQ ONNX; every input is [batch, length].
        grid: the buckets (one optimization profile each).
        precision: ``fp32`` | ``fp16`` | ``int8`` | ``fp8`` (builder flags from
            :data:`~fastpath.engines.tensorrt.plan.PRECISION_FLAGS`).
        timing_cache_path: timing cache file, read if present and rewritten after the build.
        workspace_bytes: builder workspace limit.

    Returns:
        The plan bytes.

    Raises:
        EngineError: TensorRT is missing, the ONNX does not parse (parser errors listed), or the build fails.
    """
    trt = require_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: explicit batch always
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT's ONNX parser rejected {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    for flag in builder_flags(precision):
        config.set_flag(getattr(trt.BuilderFlag, flag))
    cache_bytes = timing_cache_path.read_bytes() if timing_cache_path and timing_cache_path.is_file() else b""
    timing_cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(timing_cache, ignore_mismatch=False)
    inputs = [network.get_input(i).name for i in range(network.num_inputs)]
    for profile in bucket_profiles(grid):
        trt_profile = builder.create_optimization_profile()
        for name in inputs:
            trt_profile.set_shape(name, profile.min_shape, profile.opt_shape, profile.max_shape)
        config.add_optimization_profile(trt_profile)
    LOG.info("building TensorRT %s plan of %s with %d profiles", precision, onnx_path, len(grid.buckets))
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError(f"TensorRT failed to build a {precision} plan of {onnx_path}; see the TensorRT log above")
    if timing_cache_path is not None:
        _write_atomically(timing_cache_path, bytes(memoryview(config.get_timing_cache().serialize())))
    return bytes(memoryview(serialized))


class EngineCache:
    """Serialized plans on disk, one file per :class:`PlanKey` digest, with the key beside it as JSON.

    Args:
        directory: where plans live (created on first write).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, key: PlanKey) -> Path:
        """Where the plan for ``key`` lives."""
        return self.directory / key.file_name()

    def get_or_build(self, key: PlanKey, build: Callable[[], bytes]) -> bytes:
        """The cached plan for ``key``, or ``build()``'s result written to the cache first."""
        path = self.path(key)
        if path.is_file():
            LOG.info("TensorRT plan cache hit: %s", path)
            return path.read_bytes()
        plan = build()
        _write_atomically(path, plan)
        key_json = {**key.__dict__, "buckets": [[b.batch, b.length] for b in key.buckets]}
        _write_atomically(path.with_suffix(".json"), json.dumps(key_json, indent=2, sort_keys=True).encode())
        return plan
