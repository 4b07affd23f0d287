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


def torch_versions(root: Path) -> Path:
    """A model directory ``root/text_embedding`` with versions 1 and 2 as a GPU host holds them: each version's
    torch-runtime weights (the file its manifest lists under ``artifacts.torch``), ``tokenizer.json`` and
    ``golden.npz``, linked from the built model repository, under its manifest listing just those files.

    Skips, naming the file, when a version or its torch-runtime files are not built here.
    """
    from fastpath.manifest import read_manifest, write_manifest

    source = REPO_ROOT / "model_repository" / "text_embedding"
    model_dir = root / "text_embedding"
    for version in (1, 2):
        built = source / str(version)
        if not (built / "manifest.json").is_file():
            pytest.skip(f"{built / 'manifest.json'} not found: run 'fastpath build --int8'")
        manifest = read_manifest(built)
        entry = (manifest.get("artifacts") or {}).get("torch")
        if entry is None:
            pytest.skip(f"{built / 'manifest.json'} lists no torch-runtime artifact: run 'fastpath build --if-missing --int8'")
        names = (entry["file"], "tokenizer.json", "golden.npz")
        missing = [name for name in names if not (built / name).is_file()]
        if missing:
            pytest.skip(f"{', '.join(missing)} not found in {built}: run 'fastpath build --int8'")
        target = model_dir / str(version)
        target.mkdir(parents=True)
        for name in names:
            (target / name).symlink_to(built / name)
        write_manifest(target, names, {key: value for key, value in manifest.items() if key not in ("files", "sizes", "external_data")})
    return model_dir
