"""ONNX Runtime engines: ``engine`` (one session, CPU or another execution provider) and ``cuda_graphs``
(CUDA execution provider with one CUDA graph per bucket); :func:`load` picks one by device."""
