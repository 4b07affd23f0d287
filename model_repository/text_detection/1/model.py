"""Triton python-backend entry point for text_detection: the model lives in the fastpath package."""

from fastpath.models.text_detection.model import TextDetectionModel as TritonPythonModel  # noqa: F401
