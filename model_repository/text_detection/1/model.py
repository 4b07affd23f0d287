"""Triton python-backend entry point for text_detection: the model lives in the fastpath package."""

from fastpath.triton.text_detection import TextDetectionModel as TritonPythonModel  # noqa: F401
