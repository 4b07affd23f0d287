"""Triton python-backend entry point for text_embedding: the model lives in the fastpath package."""

from fastpath.triton.text_embedding import TextEmbeddingModel as TritonPythonModel  # noqa: F401
