"""The torch runtime's loader: safetensors weights into a :class:`~fastpath.engines.torch.engine.TorchEngine`."""

from __future__ import annotations

import inspect
from typing import Any

from fastpath.engines.base import Engine
from fastpath.engines.torch.engine import TorchEngine


def load(path: str, **options: Any) -> Engine:
    """Registry entry point (``load_engine("torch", path, **options)``).

    Args:
        path: safetensors weights (``model.fp16.safetensors`` of a version directory).
        **options: :class:`TorchEngine`'s keyword options (``device``, ``precision``, ``batch_sizes``,
            ``lengths``, ...); this function's signature is the constructor's, so ``load_engine``
            names an option the runtime does not take.

    Raises:
        ConfigError: unknown precision, or a length bucket beyond the model's positions.
        ArtifactError: the weights file is missing, unreadable or incomplete.
        EngineError: CUDA was asked for and is not available, or capture failed.
    """
    return TorchEngine(path, **options)


load.__signature__ = inspect.signature(TorchEngine).replace(return_annotation="Engine")  # type: ignore[attr-defined]
