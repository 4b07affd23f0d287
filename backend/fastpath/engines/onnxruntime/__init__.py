"""The onnxruntime runtime. Modules: ``loader`` (:func:`~fastpath.engines.onnxruntime.loader.load`, the
registry entry; picks an engine by device and layout), ``engine`` (one session, CPU or another execution
provider), ``cuda_graphs`` (CUDA execution provider, one CUDA graph per (batch, length) bucket) and
``image_cuda`` (uint8 images on the CUDA execution provider, one CUDA graph per captured shape)."""
