"""Triton python-backend entry point for text_embedding: the model lives in the fastpath package."""

from fastpath.models.text_embedding.model import TextEmbeddingModel as TritonPythonModel  # noqa: F401
