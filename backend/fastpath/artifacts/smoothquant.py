"""SmoothQuant on an ONNX graph: move activation outliers of linear MatMuls into their weights.

BERT-family models carry "massive activations": a few channels of a few tokens (here [CLS]) reach
20-30 while the rest stay near 1 (measured on all-MiniLM-L6-v2: the FFN inputs' per-tensor
maximum is 14-30, their median channel maximum about 1.2). One static, symmetric, per-tensor INT8
scale then leaves the ordinary values a handful of levels. SmoothQuant (Xiao et al., 2023,
"SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language Models")
divides each input channel j by

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

and multiplies row j of the weight by the same s_j, which leaves ``X @ W`` unchanged in exact
arithmetic and evens out the channels' ranges before quantization. In this post-LayerNorm BERT the
LayerNorm outputs also feed the residual path, so the division cannot be folded into LayerNorm:
it is an explicit ``Mul`` by ``1/s`` in front of the MatMuls that share the input (TensorRT fuses
it into the neighbouring pointwise kernel). Per-channel maxima come from running the model on the
calibration batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from fastpath.errors import ArtifactError


def linear_matmuls(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMul nodes whose second input is a 2-D initializer (the model's linear layers)."""
    weights = {init.name: init for init in model.graph.initializer}
    return [
        node for node in model.graph.node
        if node.op_type == "MatMul" and node.input[1] in weights and len(weights[node.input[1]].dims) == 2
    ]


def channel_absmax(model: onnx.ModelProto, tensors: Sequence[str], batches: Iterable[dict[str, np.ndarray]],
                   progress: Callable[[Iterable], Iterable] = lambda it: it) -> dict[str, np.ndarray]:
    """Per-channel (last axis) maximum of |value| of ``tensors`` over all calibration batches.

    Args:
        model: the fp32 model.
        tensors: names of intermediate tensors to observe.
        batches: ONNX Runtime feeds.
        progress: wraps the batch iterator (e.g. ``tqdm``).

    Returns:
        Tensor name -> float32 [channels].
    """
    import onnxruntime as ort

    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    for name in tensors:
        augmented.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(augmented.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = list(tensors)
    found: dict[str, np.ndarray] = {}
    for feeds in progress(batches):
        for name, value in zip(wanted, session.run(wanted, feeds)):
            channel_max = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            found[name] = channel_max if name not in found else np.maximum(found[name], channel_max)
    return found


def smoothing_scales(activation_absmax: np.ndarray, weights: Sequence[np.ndarray], alpha: float) -> np.ndarray:
    """``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)`` over the rows j of all ``weights`` ([in, out] each).

    Returns:
        float32 [in], clipped to >= 1e-5 so no channel is divided by zero.
    """
    weight_absmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    scales = activation_absmax.astype(np.float64) ** alpha / np.maximum(weight_absmax, 1e-8) ** (1.0 - alpha)
    return np.clip(scales, 1e-5, None).astype(np.float32)


def smooth_model(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], activation_absmax: dict[str, np.ndarray], alpha: float) -> onnx.ModelProto:
    """Return a copy of ``model`` with SmoothQuant applied to ``nodes`` (linear MatMuls).

    MatMuls that share an input share one ``Mul`` and one scale vector.

    Raises:
        ArtifactError: a weight initializer is shared with a MatMul outside the group (scaling it
            would change that MatMul), or a node's input has no observed maximum.
    """
    result = onnx.ModelProto()
    result.CopyFrom(model)
    weights = {init.name: init for init in result.graph.initializer}
    by_name = {node.name: node for node in result.graph.node}
    groups: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        groups.setdefault(node.input[0], []).append(by_name[node.name])
    weight_users: dict[str, int] = {}
    for node in result.graph.node:
        for name in node.input:
            weight_users[name] = weight_users.get(name, 0) + 1
    inserted: dict[str, onnx.NodeProto] = {}
    for index, (tensor, members) in enumerate(groups.items()):
        if tensor not in activation_absmax:
            raise ArtifactError(f"no calibration maximum for tensor {tensor!r}; run channel_absmax on it first")
        arrays = [numpy_helper.to_array(weights[m.input[1]]) for m in members]
        for member in members:
            if weight_users[member.input[1]] != 1:
                raise ArtifactError(f"weight {member.input[1]!r} of {member.name} is shared; SmoothQuant cannot scale it")
        scales = smoothing_scales(activation_absmax[tensor], arrays, alpha)
        for member, array in zip(members, arrays):
            weights[member.input[1]].CopyFrom(numpy_helper.from_array((array * scales[:, None]).astype(np.float32), member.input[1]))
        scale_name, output_name = f"smoothquant_{index}_inverse_scale", f"smoothquant_{index}_output"
        result.graph.initializer.append(numpy_helper.from_array((1.0 / scales).astype(np.float32), scale_name))
        inserted[tensor] = helper.make_node("Mul", [tensor, scale_name], [output_name], name=f"smoothquant_{index}")
        for member in members:
            member.input[0] = output_name
    pending = {mul.output[0]: mul for mul in inserted.values()}
    ordered: list[onnx.NodeProto] = []
    for node in result.graph.node:  # each Mul goes right before the first node that reads it
        for name in node.input:
            if name in pending:
                ordered.append(pending.pop(name))
        ordered.append(node)
    del result.graph.node[:]
    result.graph.node.extend(ordered)
    return result
