"""Where the GPU tests find CUDA, the torch runtime's weights and the tokenizer; skips say what is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def require_cuda():
    """The torch module, or a skip naming why CUDA is not usable here."""
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch runtime's GPU tests need it")
    if not torch.cuda.is_available():
        pytest.skip(f"no CUDA device: torch {torch.__version__} reports torch.cuda.is_available() == False")
    return torch


def bundle_dir() -> Path:
    """The folder holding ``model.fp16.safetensors`` and ``tokenizer.json``.

    ``FASTPATH_TORCH_BUNDLE`` (what benchmarks/gpu/engines_bench.py sets on the GPU machine), else
    the built fp32 version ``model_repository/text_embedding/1``; skips when neither has the files.
    """
    candidates = [Path(os.environ["FASTPATH_TORCH_BUNDLE"])] if os.environ.get("FASTPATH_TORCH_BUNDLE") else []
    candidates.append(REPO_ROOT / "model_repository" / "text_embedding" / "1")
    for folder in candidates:
        if (folder / "model.fp16.safetensors").is_file() and (folder / "tokenizer.json").is_file():
            return folder
    pytest.skip(f"model.fp16.safetensors + tokenizer.json not found in {[str(c) for c in candidates]}: run 'fastpath build'")
