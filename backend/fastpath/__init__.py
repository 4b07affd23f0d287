"""FastPath: a Python backend for NVIDIA Triton Inference Server (docs/architecture.md).

Packages, from the commands down to the building blocks:
    cli, server  ``fastpath`` commands (build, serve, swap/rollback/status, bench); the ``tritonserver`` process:
                 start, stop, device selection, the stub supervisor.
    models       one folder per served model (text_embedding, text_detection): config, pipeline, batch
                 handler and the ``TritonPythonModel`` that ``model_repository/<model>/N/model.py`` re-exports.
    swaps        live version swaps: serving slots, the control plane, the serving-version record.
    triton       python-backend plumbing the models share: the ScheduledModel base, request I/O, answers,
                 metrics, liveness, logging.
    scheduling   the batch scheduler: queue, batch policies behind one interface, cost model, threads (injected clock).
    engines      one folder per runtime (ONNX Runtime, PyTorch, TensorRT), each a loader and its engines.
    graphs       bucket sets and snapping, CUDA graph capture and replay.
    memory       pinned host and device memory: the staging pool, allocators, ``cuda_call``, memory return.
    text         tokenization for text models (HF ``tokenizers``).
    config, errors, manifest, profiling: typed ``config.pbtxt`` parameters; the exception hierarchy; a version's
                 file list and checksums (written by the build, verified before serving); phase timing.
    artifacts    the build side (export, quantization, the accuracy gate); only ``fastpath build`` imports it.
"""

__version__ = "0.1.0"
