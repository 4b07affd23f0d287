"""The torch runtime: all-MiniLM-L6-v2 in plain PyTorch, one CUDA graph per (batch, length) bucket.

Modules: ``loader`` (:func:`~fastpath.engines.torch.loader.load`, the registry entry), ``engine``
(:class:`TorchEngine`), ``bert`` (the forward), ``fp8`` (e4m3 linear layers), ``weights``
(safetensors with the config in its header). Importing this package needs torch.
"""

from fastpath.engines.torch.engine import DEFAULT_BATCH_SIZES, DEFAULT_LENGTHS, TorchEngine

__all__ = ["DEFAULT_BATCH_SIZES", "DEFAULT_LENGTHS", "TorchEngine"]
