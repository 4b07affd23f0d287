"""INT8 QDQ quantization of the fp32 ONNX model with ONNX Runtime's static quantizer.

The format TensorRT's explicit quantization accepts (TensorRT developer guide, "Explicit Quantization")
and ONNX Runtime's CPU kernels run: QuantizeLinear/DequantizeLinear (QDQ) pairs, signed INT8, symmetric
scales and zero zero-points, weights per output channel (axis 1 of a MatMul's [in, out] weight),
activations per tensor from MinMax calibration on real text. Only the linear layers (the MatMuls whose
second input is a weight, ``nodes_to_quantize``) are quantized, MatMul outputs are not
(``OpTypesToExcludeOutputQuantization``), and SmoothQuant (:mod:`fastpath.artifacts.smoothquant`) evens
out the [CLS] token's massive activations first.

Recipes are tried in order until one passes the accuracy gate on validation text: sentences of the
calibration split and the validation half of each kind of held-out text (:mod:`fastpath.artifacts.heldout`;
never the evaluation halves, which only the final gate reads). Why each choice, and each recipe's
cosine per kind of text: docs/design/engines.md ("INT8 QDQ").
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from fastpath.artifacts.smoothquant import channel_absmax, linear_matmuls, smooth_model
from fastpath.errors import ArtifactError
from fastpath.text import TextTokenizer


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantRecipe:
    """One way to quantize the model.

    Attributes:
        name: short identifier recorded in the manifest.
        smooth_alpha: SmoothQuant migration strength, or None for no smoothing.
        keep_float: regular expressions of linear MatMul node names left in float.
        per_channel: per-output-channel weight scales (False = one scale per weight tensor).
    """

    name: str
    smooth_alpha: float | None = 0.8
    keep_float: tuple[str, ...] = ()
    per_channel: bool = True


FFN_DOWN = r"layer\.\d+/output/dense/MatMul$"  # BERT's FFN down-projection (not attention/output/dense)
FFN_UP = r"layer\.\d+/intermediate/dense/MatMul$"
# every linear layer in INT8: passes on sentences, fails on blank text ("" -> [CLS] [SEP]: cosine 0.973)
ALL_LINEAR = QuantRecipe(name="int8-all-linear-smoothquant-0.8", smooth_alpha=0.8)
ATTENTION_OUT = r"layer\.\d+/attention/output/dense/MatMul$"
# FFN down-projections in float: passes on sentences (min 0.998), fails on repeated tokens ("?! " x 127: 0.986)
FFN_DOWN_FLOAT = QuantRecipe(name="int8-ffn-down-float-smoothquant-0.65", smooth_alpha=0.65, keep_float=(FFN_DOWN,))
# Tried in order until one passes the gate on validation text (docs/design/engines.md): the first
# keeps the FFN down-projections and the attention output projections in float (Q, K, V and the FFN
# up-projection INT8); the second, only Q, K and V in INT8 (about as slow as fp32 on the CPU).
RECIPES = (
    QuantRecipe(name="int8-ffn-down-attention-output-float-smoothquant-0.65", smooth_alpha=0.65,
                keep_float=(FFN_DOWN, ATTENTION_OUT)),
    QuantRecipe(name="int8-qkv-only-smoothquant-0.65", smooth_alpha=0.65, keep_float=(FFN_DOWN, FFN_UP, ATTENTION_OUT)),
)


def int8_saturates(cpuinfo: str | None = None) -> bool:
    """True on an x86-64 CPU without VNNI, where ONNX Runtime's INT8 MatMul can saturate.

    There MLAS multiplies u8 activations (the s8 ones shifted by 128) by s8 weights with AVX2's
    ``vpmaddubsw``, which sums two products into int16: 255 * 127 * 2 = 64,770 overflows 32,767. VNNI
    (``avx512_vnni``, ``avx_vnni``) and AMX (``amx_int8``) accumulate in int32. ONNX Runtime's
    quantization guide advises ``reduce_range`` (7-bit weights, |w| <= 63: 255 * 63 * 2 = 32,130) on
    such CPUs. Measured on an AMD EPYC with AVX2 only: every recipe failed the gate (sentences'
    min cosine 0.974) with 8-bit weights.

    Args:
        cpuinfo: the text of ``/proc/cpuinfo`` (read when None; not Linux or x86: False).
    """
    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return False
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return False
    return not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags)


def text_batches(texts: Sequence[str], tokenizer: TextTokenizer, batch_size: int) -> list[dict[str, np.ndarray]]:
    """Tokenize ``texts`` in order into ONNX feeds, each batch padded to its longest member."""
    batches = []
    for start in range(0, len(texts), batch_size):
        encodings = tokenizer.encode(texts[start : start + batch_size])
        batches.append(tokenizer.pad(encodings, max(len(e.ids) for e in encodings)).feeds())
    return batches


class _Reader:
    """``onnxruntime.quantization.CalibrationDataReader`` over prepared feeds."""

    def __init__(self, batches: Iterable[dict[str, np.ndarray]]) -> None:
        self._iterator = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iterator, None)

    def rewind(self) -> None:  # the MinMax calibrator reads once
        pass


def check_tensorrt_compatible(model: onnx.ModelProto) -> int:
    """Check every Q/DQ pair is signed INT8 with zero zero-points; return how many QuantizeLinear nodes.

    Raises:
        ArtifactError: naming the first node with a non-zero or non-int8 zero point.
    """
    initializers = {init.name: init for init in model.graph.initializer}
    quantize_nodes = 0
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        quantize_nodes += node.op_type == "QuantizeLinear"
        if len(node.input) < 3 or node.input[2] not in initializers:
            raise ArtifactError(f"{node.op_type} {node.name} has no constant zero point; TensorRT needs int8 zero points of 0")
        zero_point = numpy_helper.to_array(initializers[node.input[2]])
        if zero_point.dtype != np.int8 or np.any(zero_point != 0):
            raise ArtifactError(f"{node.op_type} {node.name} has zero point {zero_point.ravel()[:4]} ({zero_point.dtype}); TensorRT needs int8 zeros")
    return quantize_nodes


def _quantize_static(model_path: Path, output_path: Path, calibration: Sequence[dict[str, np.ndarray]], nodes: list[str],
                     recipe: QuantRecipe, progress: Callable[[Iterable, str], Iterable], *, reduce_range: bool) -> None:
    """ONNX Runtime's static quantizer with the TensorRT-compatible options (module docstring); ``reduce_range``:
    7-bit weights (:func:`int8_saturates`)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(
        str(model_path), str(output_path), _Reader(progress(calibration, "calibration")),
        quant_format=QuantFormat.QDQ, per_channel=recipe.per_channel, reduce_range=reduce_range,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"], nodes_to_quantize=nodes,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            "OpTypesToExcludeOutputQuantization": ["MatMul"],
            # one Q/DQ pair per consumer: ONNX Runtime fuses DQ -> MatMul into MatMulIntegerToFloat only
            # when the DQ has a single consumer (Q, K and V share their input)
            "DedicatedQDQPair": True,
            "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},
        },
    )


def quantize_int8(fp32_path: Path, output_path: Path, calibration: Sequence[dict[str, np.ndarray]], recipe: QuantRecipe,
                  *, progress: Callable[[Iterable, str], Iterable] = lambda it, _desc: it) -> dict:
    """Write an INT8 QDQ model of ``fp32_path`` to ``output_path``.

    Args:
        fp32_path: the fp32 ONNX model.
        output_path: where the QDQ model goes.
        calibration: ONNX Runtime feeds of calibration text.
        recipe: smoothing, float-kept layers and weight granularity.
        progress: wraps an iterable with a progress bar (``tqdm``-like, second argument a label).

    Returns:
        Summary for the manifest: recipe, counts of quantized and float linear layers, Q nodes.

    Raises:
        ArtifactError: the result is not TensorRT-compatible (non-zero zero points).
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32_path, output_path = Path(fp32_path).resolve(), Path(output_path).resolve()
    with tempfile.TemporaryDirectory(prefix="fastpath-quantize-") as work_name:
        work = Path(work_name)
        prepared = work / "prepared.onnx"
        with contextlib.chdir(work):  # ONNX Runtime's shape inference dumps a model into the cwd when it fails
            quant_pre_process(str(fp32_path), str(prepared), auto_merge=True)
        model = onnx.load(str(prepared))
        linear = linear_matmuls(model)
        kept = [n.name for n in linear if any(re.search(p, n.name) for p in recipe.keep_float)]
        quantized = [n.name for n in linear if n.name not in kept]
        if recipe.smooth_alpha is not None:
            targets = [n for n in linear if n.name in quantized]
            maxima = channel_absmax(model, sorted({n.input[0] for n in targets}), progress(calibration, "smoothquant statistics"))
            model = smooth_model(model, targets, maxima, recipe.smooth_alpha)
        smoothed = work / "smoothed.onnx"
        onnx.save(model, str(smoothed))
        reduce_range = int8_saturates()
        _quantize_static(smoothed, output_path, calibration, quantized, recipe, progress, reduce_range=reduce_range)
    quantize_nodes = check_tensorrt_compatible(onnx.load(str(output_path)))
    return {
        "recipe": dataclasses.asdict(recipe),
        "linear_layers_int8": len(quantized),
        "linear_layers_float": kept,
        "quantize_linear_nodes": quantize_nodes,
        "calibration_batches": len(calibration),
        "calibration_method": "MinMax",
        "activations": "int8 symmetric per tensor (zero point 0)",
        "weights": "int8 symmetric " + ("per output channel" if recipe.per_channel else "per tensor")
                   + (", 7-bit range (reduce_range: the building CPU has no VNNI)" if reduce_range else ""),
        "reduce_range": reduce_range,
    }
