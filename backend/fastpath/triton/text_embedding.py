"""``TritonPythonModel`` for text embedding (``model_repository/text_embedding``).

Inputs and outputs (see ``config.pbtxt``; max_batch_size > 0, so each carries a batch dimension):
    TEXT         TYPE_STRING [n, 1]   UTF-8 texts.
    EMBEDDING    TYPE_FP32   [n, 384] L2-normalized mean-pooled embedding.
    TOKEN_COUNT  TYPE_INT32  [n, 1]   tokens the model saw ([CLS], [SEP] included).
    TRUNCATED    TYPE_BOOL   [n, 1]   True where the text exceeded max_seq_length tokens.

Every request in an ``execute`` call is validated on its own: a bad request gets its own 400 and
the others of the call are embedded together, batched by length.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.config import TextEmbeddingConfig, parse_parameters, triton_parameters
from fastpath.models.text_embedding import TextEmbedder
from fastpath.text import decode_texts
from fastpath.triton.io import error_response, read_input
from fastpath.triton.selftest import run_self_test

INPUT_NAME = "TEXT"


class TextEmbeddingModel:
    """The python-backend model class; ``model.py`` re-exports it as ``TritonPythonModel``."""

    def initialize(self, args: dict[str, str]) -> None:
        """Parse the config, self-test the stub, load tokenizer and engine.

        Raises:
            ConfigError, SelfTestError, ArtifactError, EngineError: the model refuses to load,
                and Triton reports the message.
        """
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        run_self_test(pb_utils.Tensor)
        model_config = json.loads(args["model_config"])
        self.config = parse_parameters(TextEmbeddingConfig, triton_parameters(model_config))
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.embedder = TextEmbedder.from_directory(version_dir, self.config)
        self.model_version = args["model_version"]

    def _read_texts(self, request: Any) -> list[str]:
        values = read_input(self._pb, request, INPUT_NAME)
        return decode_texts(values, tensor=INPUT_NAME, max_text_bytes=self.config.max_text_bytes)

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer each request with embeddings or its own error; one engine pass for all of them."""
        pb = self._pb
        responses: list[Any] = [None] * len(requests)
        accepted: list[tuple[int, list[str]]] = []
        for index, request in enumerate(requests):
            try:
                accepted.append((index, self._read_texts(request)))
            except Exception as exc:  # a bad request fails alone
                responses[index] = error_response(pb, exc)
        if accepted:
            texts = [text for _, request_texts in accepted for text in request_texts]
            try:
                result = self.embedder.embed(texts)
            except Exception as exc:
                for index, _ in accepted:
                    responses[index] = error_response(pb, exc)
                return responses
            start = 0
            for index, request_texts in accepted:
                part = result.slice(start, start + len(request_texts))
                start += len(request_texts)
                responses[index] = pb.InferenceResponse(
                    output_tensors=[
                        pb.Tensor("EMBEDDING", np.ascontiguousarray(part.embeddings)),
                        pb.Tensor("TOKEN_COUNT", part.token_counts.reshape(-1, 1)),
                        pb.Tensor("TRUNCATED", part.truncated.reshape(-1, 1)),
                    ]
                )
        return responses

    def finalize(self) -> None:
        """Release the engine."""
        embedder = getattr(self, "embedder", None)
        if embedder is not None:
            embedder.close()
