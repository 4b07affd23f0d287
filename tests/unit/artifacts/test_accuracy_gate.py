"""The INT8 accuracy gate: cosine >= 0.99 minimum and >= 0.995 mean to fp32 on held-out text.

A deliberately per-tensor-quantized model (ONNX Runtime's plain dynamic quantization, one scale per
weight tensor) is rejected, and the message says by how much; the built INT8 version passes.
"""

import numpy as np
import pytest

from fastpath.artifacts.accuracy import check_gate, cosines, embed_batches, report
from fastpath.artifacts.heldout import calibration_extras, heldout_texts, split_heldout
from fastpath.artifacts.quantize import text_batches
from fastpath.artifacts.torch_weights import evaluation_texts
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import AccuracyGateError, ArtifactError
from fastpath.manifest import read_manifest
from fastpath.text import TextTokenizer
from fastpath.text.corpus import pydoc_sentences, split_sentences
from tests.conftest import MODEL_REPOSITORY

MODEL_DIR = MODEL_REPOSITORY / "text_embedding"
HELD_OUT = 96


@pytest.fixture(scope="module")
def evaluation():
    tokenizer = TextTokenizer(MODEL_DIR / "1" / "tokenizer.json", max_seq_length=256)
    texts = evaluation_texts(HELD_OUT)
    return texts, text_batches(texts, tokenizer, 32)


def embed(path, batches):
    with OnnxRuntimeEngine(str(path)) as engine:
        return embed_batches(lambda feeds: engine.infer(feeds)["embedding"], batches)


@pytest.fixture(scope="module")
def fp32_embeddings(evaluation):
    return embed(MODEL_DIR / "1" / "model.onnx", evaluation[1])


def test_evaluation_text_never_overlaps_calibration_text():
    calibration, held_out = split_sentences(pydoc_sentences())
    assert not set(calibration) & set(held_out)
    assert set(evaluation_texts(HELD_OUT)) <= set(held_out)


def test_report_and_gate_arithmetic():
    reference = np.eye(4, 8, dtype=np.float32)
    candidate = reference.copy()
    candidate[2] = np.cos(0.2) * reference[2] + np.sin(0.2) * np.eye(8, dtype=np.float32)[7]  # cosine 0.980067
    result = report(reference, candidate, ["a", "b", "c", "d"], reference_name="fp32", candidate_name="int8", split="test")
    assert result.min_cosine == pytest.approx(0.980067, abs=1e-6) and result.worst_text == "c"
    assert result.mean_cosine == pytest.approx((3 + 0.980067) / 4, abs=1e-6)
    assert not result.passed
    with pytest.raises(AccuracyGateError, match=r"min cosine 0.9801 < 0.99 \(short by 0.0099; worst text: 'c'\)"):
        check_gate(result)
    assert check_gate(report(reference, reference, list("abcd"), reference_name="r", candidate_name="c", split="s")).passed


def test_nan_or_mismatched_embeddings_are_errors():
    with pytest.raises(ArtifactError, match="cannot be compared"):
        cosines(np.ones((2, 3)), np.ones((3, 3)))
    with pytest.raises(ArtifactError, match="NaN/Inf or zero"):
        cosines(np.ones((2, 3)), np.array([[1, 0, 0], [np.nan, 0, 0]]))


def test_per_tensor_quantized_model_is_rejected(tmp_path, evaluation, fp32_embeddings):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    per_tensor = tmp_path / "per_tensor.onnx"
    quantize_dynamic(str(MODEL_DIR / "1" / "model.onnx"), str(per_tensor), per_channel=False, weight_type=QuantType.QInt8)
    texts, batches = evaluation
    result = report(fp32_embeddings, embed(per_tensor, batches), texts, reference_name="fp32",
                    candidate_name="per-tensor dynamic int8", split="evaluation")
    with pytest.raises(AccuracyGateError, match=r"per-tensor dynamic int8 fails the accuracy gate .*short by 0\.\d{4}"):
        check_gate(result)
    assert result.min_cosine < 0.99


def test_the_built_int8_version_passes_on_held_out_text(evaluation, fp32_embeddings):
    int8 = MODEL_DIR / "2" / "model.onnx"
    if not int8.exists():
        pytest.skip("text_embedding/2 is not built: run 'fastpath build --int8' (make test does)")
    texts, batches = evaluation
    result = check_gate(report(fp32_embeddings, embed(int8, batches), texts, reference_name="fp32", candidate_name="int8", split="evaluation"))
    assert result.min_cosine >= 0.99 and result.mean_cosine >= 0.995


def test_held_out_kinds_are_split_disjointly_and_never_calibrate():
    """Every kind is gated (non-empty evaluation half); the halves are disjoint; no held-out text is calibration text."""
    kinds = heldout_texts()
    assert set(kinds) == {"repeated", "punctuation", "blank", "multilingual", "emoji", "code", "urls", "numbers", "markup"}
    validation, evaluation_half = split_heldout(kinds)
    for kind, texts in kinds.items():
        assert evaluation_half[kind], kind
        assert not set(validation.get(kind, ())) & set(evaluation_half[kind])
        assert sorted(validation.get(kind, []) + evaluation_half[kind]) == sorted(texts)
    held_out = {text for texts in kinds.values() for text in texts}
    calibration_split, _ = split_sentences(pydoc_sentences())
    assert not held_out & (set(calibration_extras()) | set(calibration_split))
    assert split_heldout(heldout_texts()) == (validation, evaluation_half)  # deterministic


def test_the_built_int8_version_passes_on_every_kind_of_held_out_text():
    """Invariant: min cosine >= 0.99 and mean >= 0.995 to fp32 on each kind (repeated tokens, blank text,
    other scripts, emoji, code, URLs, numbers, markup), and its manifest records the figures per kind."""
    int8 = MODEL_DIR / "2" / "model.onnx"
    if not int8.exists():
        pytest.skip("text_embedding/2 is not built: run 'fastpath build --int8' (make test does)")
    tokenizer = TextTokenizer(MODEL_DIR / "1" / "tokenizer.json", max_seq_length=256)
    recorded = read_manifest(MODEL_DIR / "2")["accuracy"]["heldout"]
    for kind, texts in heldout_texts().items():
        batches = text_batches(texts, tokenizer, 32)
        result = report(embed(MODEL_DIR / "1" / "model.onnx", batches), embed(int8, batches), texts, reference_name="fp32",
                        candidate_name="int8", split=kind)
        assert result.passed, (kind, result.shortfalls())
        assert recorded[kind]["passed"] and recorded[kind]["min_cosine"] >= 0.99, kind
