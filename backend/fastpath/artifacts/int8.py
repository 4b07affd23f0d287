"""Building the INT8 version (``text_embedding/2``) from the fp32 version (``text_embedding/1``).

Steps (each with a progress bar where it takes more than a moment):

1. Verify the fp32 version's manifest (a tampered source is refused before anything is built).
2. Split :mod:`fastpath.text.corpus` text: calibration sentences and validation sentences from the
   calibration split (disjoint from each other), evaluation sentences from the evaluation split.
   Calibration also gets :func:`~fastpath.artifacts.heldout.calibration_extras` (degenerate text);
   the held-out texts of :mod:`fastpath.artifacts.heldout` are split per kind into a validation and
   an evaluation half.
3. Try each :data:`~fastpath.artifacts.quantize.RECIPES` entry until one passes the accuracy gate on
   the validation sentences and on each kind's validation half.
4. The gate proper on the evaluation split, on each held-out kind's evaluation half, and on the
   fp32 version's golden texts: below cosine 0.99 minimum or 0.995 mean on any of them, the build
   fails saying where and by how much, and publishes nothing.
5. Write ``model.onnx`` (INT8 QDQ), ``tokenizer.json`` and ``golden.npz`` (the fp32 truth, copied),
   the ``model.py`` shim, and a manifest; publish the directory atomically
   (:func:`fastpath.swaps.publish.publish_version`): it appears whole or not at all.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from fastpath.artifacts.accuracy import AccuracyReport, check_gate, embed_batches, report, reports_by_kind, shortfalls_by_kind
from fastpath.artifacts.heldout import calibration_extras, heldout_texts, split_heldout
from fastpath.artifacts.quantize import RECIPES, QuantRecipe, quantize_int8, text_batches
from fastpath.artifacts.staging import staging_dir
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import AccuracyGateError, ArtifactError
from fastpath.manifest import verify_manifest, write_manifest
from fastpath.text import TextTokenizer
from fastpath.text.corpus import pydoc_sentences, split_sentences

LOG = logging.getLogger("fastpath.artifacts")

FP32_VERSION = 1
INT8_VERSION = 2
SHIM = "model.py"
# the python-backend entry point; identical to version 1's (Triton offers a version only with it)
SHIM_TEXT = (
    '"""Triton python-backend entry point for text_embedding: the model lives in the fastpath package."""\n\n'
    "from fastpath.models.text_embedding.model import TextEmbeddingModel as TritonPythonModel  # noqa: F401\n"
)
FILES = ("model.onnx", "tokenizer.json", "golden.npz", SHIM)
Progress = Callable[[Iterable, str], Iterable]
# edge texts: blank text ([CLS] [SEP] only), unicode, a text truncated at 256 tokens
EDGE_TEXTS = ("", "   ", "hello world", " 😃 naïve café 的人有", "word " * 300)


def tqdm_progress(iterable: Iterable, description: str) -> Iterable:
    """Wrap ``iterable`` in a tqdm progress bar on stderr (updates at most once a second)."""
    from tqdm import tqdm

    return tqdm(iterable, desc=description, unit="batch", mininterval=1.0, leave=False)


def _embed(path: Path, batches: list[dict[str, np.ndarray]], progress: Progress, label: str) -> np.ndarray:
    with OnnxRuntimeEngine(str(path)) as engine:
        return embed_batches(lambda feeds: engine.infer(feeds)["embedding"], progress(batches, label))


def _golden_report(candidate: Path, source: Path, tokenizer: TextTokenizer) -> dict:
    with np.load(source / "golden.npz", allow_pickle=False) as golden:
        texts, expected = [str(t) for t in golden["texts"]], golden["embeddings"]
    got = _embed(candidate, text_batches(texts, tokenizer, 32), lambda it, _label: it, "golden")
    return check_gate(report(expected, got, texts, reference_name="golden.npz (fp32)", candidate_name="model.onnx (int8)",
                             split="golden texts", mean_cosine=0.99)).to_dict()


class _Reference:
    """The fp32 embeddings of a set of texts by kind, computed once; :meth:`reports` compares a candidate."""

    def __init__(self, source_onnx: Path, kinds: dict[str, list[str]], tokenizer: TextTokenizer, progress: Progress,
                 label: str) -> None:
        self.kinds, self.label = kinds, label
        self.texts = [text for texts in kinds.values() for text in texts]
        self.batches = text_batches(self.texts, tokenizer, 32)
        self.embeddings = _embed(source_onnx, self.batches, progress, f"fp32 on {label}")

    def reports(self, candidate: Path, candidate_name: str, progress: Progress) -> dict[str, AccuracyReport]:
        """One report per kind (each held to the gate's bounds on its own)."""
        got = _embed(candidate, self.batches, progress, f"int8 on {self.label}")
        return reports_by_kind(self.kinds, self.embeddings, got, reference_name="fp32 model.onnx",
                               candidate_name=candidate_name, label=self.label)


def _first_passing_recipe(source_onnx: Path, output: Path, calibration: list[dict], validation: dict[str, list[str]],
                          tokenizer: TextTokenizer, recipes: Iterable[QuantRecipe], progress: Progress) -> tuple[dict, dict]:
    reference = _Reference(source_onnx, validation, tokenizer, progress, "validation text")
    failures = []
    for recipe in recipes:
        LOG.info("quantizing with recipe %s", recipe.name)
        summary = quantize_int8(source_onnx, output, calibration, recipe, progress=progress)
        reports = reference.reports(output, f"int8 ({recipe.name})", progress)
        shortfalls = shortfalls_by_kind(reports)
        if not shortfalls:
            return summary, {kind: result.to_dict() for kind, result in reports.items()}
        failures.append(f"{recipe.name}: " + "; ".join(shortfalls))
        LOG.warning("recipe %s fails on validation text: %s", recipe.name, "; ".join(shortfalls))
    raise AccuracyGateError("no quantization recipe passes the accuracy gate on validation text: " + " | ".join(failures))


def _metadata(source_manifest: dict, source_version: int, summary: dict, validation: dict, evaluation: AccuracyReport,
              heldout: dict, golden: dict, calibration_texts: int, validation_texts: int, started: float) -> dict:
    """The INT8 version's manifest fields (``write_manifest`` adds files and sizes)."""
    return {
        "model": source_manifest.get("model"),
        "source": {"version": source_version, "model.onnx_sha256": source_manifest["files"]["model.onnx"],
                   "upstream": source_manifest.get("source")},
        "precision": "int8",
        "artifact": "model.onnx",
        "artifacts": {"onnxruntime": {"file": "model.onnx", "precision": "int8 QDQ"},
                      "tensorrt": {"file": "model.onnx", "precision": "int8 (explicit quantization) + fp16"}},
        "quantization": {**summary, "calibration_texts": calibration_texts, "validation_texts": validation_texts},
        "buckets": source_manifest.get("buckets"),
        "accuracy": {"evaluation": evaluation.to_dict(), "heldout": heldout, "validation": validation, "golden": golden},
        "golden": {"file": "golden.npz", "texts": golden["texts"], "min_cosine": 0.99},
        "tools": {name: md.version(name) for name in ("onnxruntime", "onnx", "numpy", "tokenizers")},
        "inputs": source_manifest.get("inputs"), "output": source_manifest.get("output"),
        "max_seq_length": source_manifest.get("max_seq_length", 256),
        "build_seconds": round(time.perf_counter() - started, 1),
    }


def build_int8_version(model_dir: Path, *, source_version: int = FP32_VERSION, target_version: int = INT8_VERSION,
                       calibration_texts: int = 256, validation_texts: int = 256, evaluation_texts: int | None = None,
                       recipes: Iterable[QuantRecipe] = RECIPES, progress: Progress = tqdm_progress) -> Path:
    """Quantize ``model_dir/<source_version>`` into ``model_dir/<target_version>`` behind the accuracy gate.

    Args:
        model_dir: the model's directory in the model repository (``model_repository/text_embedding``).
        source_version: the fp32 version.
        target_version: the version to (re)publish.
        calibration_texts: sentences from the calibration split used for calibration.
        validation_texts: further sentences of the calibration split used to choose a recipe.
        evaluation_texts: sentences of the evaluation split for the final gate (None: all of them).
        recipes: quantization recipes to try, in order.
        progress: progress-bar wrapper.

    Returns:
        The published version directory.

    Raises:
        ArtifactError: the source version is missing or fails verification, or the split is too small.
        AccuracyGateError: the INT8 model fails the gate (message says by how much); nothing is published.
    """
    from fastpath.swaps.publish import publish_version

    started = time.perf_counter()
    source = model_dir / str(source_version)
    source_manifest = verify_manifest(source, required=("model.onnx", "tokenizer.json", "golden.npz"))
    if source_manifest.get("precision") != "fp32":
        raise ArtifactError(f"{source} holds precision {source_manifest.get('precision')!r}; INT8 is built from an fp32 version")
    calibration_split, evaluation_split = split_sentences(pydoc_sentences())
    if calibration_texts + validation_texts > len(calibration_split):
        raise ArtifactError(f"{calibration_texts} calibration + {validation_texts} validation sentences exceed the {len(calibration_split)} of the calibration split")
    evaluation = evaluation_split[:evaluation_texts]
    tokenizer = TextTokenizer(source / "tokenizer.json", max_seq_length=source_manifest.get("max_seq_length", 256))
    calibration = text_batches(sorted(calibration_split[:calibration_texts] + calibration_extras(), key=len), tokenizer, 16)
    heldout_validation, heldout_evaluation = split_heldout(heldout_texts())
    validation = {"sentences": [*calibration_split[len(calibration_split) - validation_texts:], *EDGE_TEXTS],
                  **heldout_validation}
    with staging_dir(model_dir, f"int8-{target_version}") as work_name:
        work = Path(work_name)
        summary, validation_report = _first_passing_recipe(source / "model.onnx", work / "model.onnx", calibration,
                                                           validation, tokenizer, recipes, progress)
        batches = text_batches(evaluation, tokenizer, 32)
        reference = _embed(source / "model.onnx", batches, progress, "fp32 on evaluation text")
        candidate = _embed(work / "model.onnx", batches, progress, "int8 on evaluation text")
        evaluation_report = check_gate(report(reference, candidate, evaluation, reference_name=f"version {source_version} model.onnx (fp32)",
                                              candidate_name="model.onnx (int8 QDQ)", split="pydoc evaluation split"))
        LOG.info("evaluation: min cosine %.4f, mean %.4f on %d texts", evaluation_report.min_cosine,
                 evaluation_report.mean_cosine, evaluation_report.texts)
        heldout = _Reference(source / "model.onnx", heldout_evaluation, tokenizer, progress, "held-out text").reports(
            work / "model.onnx", "model.onnx (int8 QDQ)", progress)
        shortfalls = shortfalls_by_kind(heldout)
        if shortfalls:
            raise AccuracyGateError("model.onnx (int8 QDQ) fails the accuracy gate against the fp32 version on held-out "
                                    "text: " + " | ".join(shortfalls))
        for kind, result in heldout.items():
            LOG.info("held-out %s: min cosine %.4f, mean %.4f on %d texts", kind, result.min_cosine, result.mean_cosine, result.texts)
        golden = _golden_report(work / "model.onnx", source, tokenizer)
        for name in ("tokenizer.json", "golden.npz"):
            shutil.copyfile(source / name, work / name)
        (work / SHIM).write_text(SHIM_TEXT)
        write_manifest(work, FILES, _metadata(source_manifest, source_version, summary, validation_report, evaluation_report,
                                              {kind: result.to_dict() for kind, result in heldout.items()}, golden,
                                              calibration_texts, validation_texts, started))
        published = publish_version(work, model_dir, target_version, replace=True)
    LOG.info("published %s: evaluation min cosine %.4f, mean %.4f on %d texts", published,
             evaluation_report.min_cosine, evaluation_report.mean_cosine, evaluation_report.texts)
    return published
