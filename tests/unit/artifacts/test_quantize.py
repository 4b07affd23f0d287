"""INT8 QDQ building blocks: SmoothQuant is exact in fp32, the result is TensorRT-compatible."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fastpath.artifacts.quantize import check_tensorrt_compatible, int8_saturates, text_batches
from fastpath.artifacts.smoothquant import channel_absmax, linear_matmuls, smooth_model, smoothing_scales
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import ArtifactError
from fastpath.manifest import read_manifest
from fastpath.text import TextTokenizer
from tests.conftest import MODEL_REPOSITORY

MODEL_DIR = MODEL_REPOSITORY / "text_embedding"


@pytest.fixture(scope="module")
def tokenizer():
    return TextTokenizer(MODEL_DIR / "1" / "tokenizer.json", max_seq_length=256)


def test_text_batches_keep_order_and_pad_per_batch(tokenizer):
    batches = text_batches(["hello world", "a much longer sentence than the first one", ""], tokenizer, 2)
    assert [b["input_ids"].shape for b in batches] == [(2, 10), (1, 2)]
    assert batches[0]["input_ids"][0, :4].tolist() == [101, 7592, 2088, 102]
    assert batches[1]["input_ids"].tolist() == [[101, 102]]


def test_smoothing_scales_follow_the_formula():
    activation = np.array([16.0, 1.0], dtype=np.float32)
    weights = [np.array([[0.25, -1.0], [4.0, 0.5]], dtype=np.float32)]  # row maxima 1, 4
    np.testing.assert_allclose(smoothing_scales(activation, weights, 0.5), [4.0, 0.5])


def test_smoothquant_leaves_the_fp32_function_unchanged(tmp_path, tokenizer):
    model = onnx.load(str(MODEL_DIR / "1" / "model.onnx"))
    linear = linear_matmuls(model)
    assert len(linear) == 36  # 6 layers x (Q, K, V, attention out, FFN up, FFN down)
    batches = text_batches(["hello world", "Smoothing moves outliers from activations into weights.", ""], tokenizer, 3)
    maxima = channel_absmax(model, sorted({n.input[0] for n in linear}), batches)
    assert max(float(m.max()) for m in maxima.values()) > 10 * float(np.median(np.concatenate(list(maxima.values()))))
    smoothed = smooth_model(model, linear, maxima, 0.8)
    assert sum(n.op_type == "Mul" and n.name.startswith("smoothquant_") for n in smoothed.graph.node) == 24  # QKV share one
    onnx.save(smoothed, str(tmp_path / "smoothed.onnx"))
    with OnnxRuntimeEngine(str(MODEL_DIR / "1" / "model.onnx")) as before, OnnxRuntimeEngine(str(tmp_path / "smoothed.onnx")) as after:
        np.testing.assert_allclose(after.infer(batches[0])["embedding"], before.infer(batches[0])["embedding"], atol=2e-6)


def _qdq_model(zero_point: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="q"),
         helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], name="dq")],
        "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(0.1, dtype=np.float32), "scale"), numpy_helper.from_array(zero_point, "zero")],
    )
    return helper.make_model(graph)


def test_tensorrt_compatibility_check():
    assert check_tensorrt_compatible(_qdq_model(np.array(0, dtype=np.int8))) == 1
    with pytest.raises(ArtifactError, match="zero point \\[3\\] \\(int8\\); TensorRT needs int8 zeros"):
        check_tensorrt_compatible(_qdq_model(np.array(3, dtype=np.int8)))
    with pytest.raises(ArtifactError, match="uint8"):
        check_tensorrt_compatible(_qdq_model(np.array(128, dtype=np.uint8)))


CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2{extra}
bugs\t\t: sysret_ss_attrs
"""


def test_int8_saturates_on_x86_cpus_without_vnni_only():
    """Invariant: 7-bit weights (reduce_range) exactly where ONNX Runtime's u8s8 kernel sums into int16 (AVX2 without
    VNNI): an AVX2-only EPYC saturates; avx512_vnni, avx_vnni or amx_int8 accumulate in int32; no flags line: no claim."""
    assert int8_saturates(CPUINFO.format(vendor="AuthenticAMD", model="AMD EPYC", extra=""))
    assert int8_saturates(CPUINFO.format(vendor="GenuineIntel", model="Xeon", extra=" avx512f avx512bw"))  # AVX-512 without VNNI
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        assert not int8_saturates(CPUINFO.format(vendor="GenuineIntel", model="Xeon", extra=f" avx512f {flag}"))
    assert not int8_saturates("processor\t: 0\nmodel name\t: unknown\n")


def test_the_built_int8_model_is_signed_symmetric_per_channel():
    path = MODEL_DIR / "2" / "model.onnx"
    if not path.exists():
        pytest.skip("text_embedding/2 is not built: run 'fastpath build --int8' (make test does)")
    model = onnx.load(str(path))
    int8_layers = read_manifest(MODEL_DIR / "2")["quantization"]["linear_layers_int8"]
    assert check_tensorrt_compatible(model) == int8_layers  # one activation Q/DQ pair per INT8 linear layer (DedicatedQDQPair)
    initializers = {i.name: i for i in model.graph.initializer}
    weight_scales = [numpy_helper.to_array(initializers[n.input[1]]) for n in model.graph.node
                     if n.op_type == "DequantizeLinear" and n.input[0] in initializers]
    assert len(weight_scales) == int8_layers and all(s.ndim == 1 and s.size in (384, 1536) for s in weight_scales)  # per output channel
    # 7-bit weights where this CPU's INT8 kernel would saturate (int8_saturates), the full int8 range elsewhere
    reduce_range = read_manifest(MODEL_DIR / "2")["quantization"]["reduce_range"]
    assert reduce_range == int8_saturates()
    largest = max(int(np.abs(numpy_helper.to_array(initializers[n.input[0]]).astype(np.int32)).max()) for n in model.graph.node
                  if n.op_type == "DequantizeLinear" and n.input[0] in initializers)
    assert largest <= 64 if reduce_range else 64 < largest <= 127
