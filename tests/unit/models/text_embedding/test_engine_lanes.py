"""Engine lanes of the real text_embedding artifacts (concurrent_batches): every lane is warmed and
checked against the main session before it serves (initial load and live swaps alike)."""

import pytest

from fastpath.engines.onnxruntime.engine import _Memory, _session
from fastpath.errors import EngineError
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.pipeline import TextEmbedder
from tests.conftest import MODEL_REPOSITORY

VERSION_1 = MODEL_REPOSITORY / "text_embedding" / "1"
INT8_ONNX = MODEL_REPOSITORY / "text_embedding" / "2" / "model.onnx"


def test_lanes_match_the_main_session_and_a_lane_that_differs_is_named():
    embedder = TextEmbedder.from_directory(VERSION_1, TextEmbeddingConfig(concurrent_batches=2))
    try:
        assert embedder.engine.lanes == 2
        embedder.check_lanes()  # fp32, one thread per lane vs the main session's threads: same embeddings
        if not INT8_ONNX.is_file():
            pytest.skip(f"{INT8_ONNX} is missing (make test builds it); the mismatch half needs a second real model")
        # a lane that runs another artifact (the INT8 build) must be caught before it serves
        embedder.engine._lane_sessions[1] = _session(str(INT8_ONNX), ("CPUExecutionProvider",), 1, False, _Memory(arena=True, pattern=True))
        with pytest.raises(EngineError, match=r"engine lane 1 differs from the main session by .* \(max abs, expected <= 0.0001\)"):
            embedder.check_lanes()
    finally:
        embedder.close()


def test_an_engine_without_lanes_has_nothing_to_check():
    embedder = TextEmbedder.from_directory(VERSION_1, TextEmbeddingConfig(concurrent_batches=1))
    try:
        assert embedder.engine.lanes == 0
        embedder.check_lanes()
    finally:
        embedder.close()
