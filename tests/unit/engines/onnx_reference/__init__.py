"""A runtime added the way every runtime is: this folder (a loader and an engine) plus one registry line.

ONNX graphs evaluated in numpy by onnx's reference evaluator (``onnx.reference.ReferenceEvaluator``):
slow, exact, and independent of ONNX Runtime, so the engine contract is checked on a second runtime.
"""
