"""FastPath: a Python backend for NVIDIA Triton Inference Server.

Packages:
    config       typed, validated model configuration built from ``config.pbtxt`` parameters.
    errors       the exception hierarchy (one root, typed subclasses).
    text         tokenization for text models (HF ``tokenizers``).
    engines      one module per runtime (ONNX Runtime, PyTorch, TensorRT) behind one interface.
    models       model pipelines (text embedding) independent of Triton.
    scheduling   FastPath's batch scheduler policy (pure Python, injected clock).
    memory       the host staging pool (page-locked where CUDA exists).
    triton       the ``TritonPythonModel`` adapter used by ``model_repository/*/N/model.py``.
    server       starts and stops the ``tritonserver`` process.
"""

__version__ = "0.1.0"
