"""The tensorrt runtime's loader: an ONNX file built into a cached plan, run by a
:class:`~fastpath.engines.tensorrt.runtime.TensorRTEngine`.

Imports without ``tensorrt`` and cuda-python; loading without them raises
:class:`~fastpath.errors.EngineError` naming the missing package.
"""

from __future__ import annotations

import inspect
from typing import Any

from fastpath.engines.base import Engine
from fastpath.engines.tensorrt.runtime import TensorRTEngine


def load(path: str, **options: Any) -> Engine:
    """Registry entry point (``load_engine("tensorrt", path, **options)``).

    Args:
        path: the ``.onnx`` file (fp32 or INT8 QDQ); inputs int64 [B, L], one float32 [B, D] output.
        **options: :class:`TensorRTEngine`'s keyword options (``precision``, ``batch_sizes``, ``lengths``,
            ``cache_dir``, ...); this function's signature is the constructor's, so ``load_engine``
            names an option the runtime does not take.

    Raises:
        EngineError: TensorRT or cuda-python is missing (the message names the package), or the build fails.
        CudaError: a CUDA call fails.
    """
    return TensorRTEngine(path, **options)


load.__signature__ = inspect.signature(TensorRTEngine).replace(return_annotation="Engine")  # type: ignore[attr-defined]
