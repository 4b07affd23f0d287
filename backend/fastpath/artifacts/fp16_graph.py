"""ONNX graph steps around ``onnxruntime.transformers.float16`` for mixed fp16/float32 models, and a CPU emulation of one.

The conversion itself is the library's (:func:`fastpath.artifacts.detection_fp16.write_fp16`); these steps fix what it
does to the nodes kept in float32 (:func:`constants_to_initializers` before, :func:`drop_cast_pairs` after).
:func:`emulated_fp16` is for analysis: ONNX Runtime's CPU EP runs an fp16 graph, but not as a GPU does: it runs ops
without a CPU fp16 kernel in float32 and drops the fp16 round trips around them, so its maps are not the fp16 maps.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence


def float_activations(model) -> list[tuple[str, str, str]]:
    """(tensor, producer node, op type) of every float32 node output of ``model`` (Constant nodes excluded)."""
    from onnx import TensorProto, shape_inference

    inferred = shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    return [(out, node.name, node.op_type) for node in model.graph.node if node.op_type != "Constant"
            for out in node.output if types.get(out) == TensorProto.FLOAT]


def constants_to_initializers(model) -> int:
    """Move every Constant node holding a ``value`` tensor into the initializers, in place; returns how many moved.

    ``convert_float_to_float16`` converts a Constant node's tensor unless the Constant itself is blocked, and a
    blocked Constant gets a Cast to fp16 after it all the same; an initializer read only by blocked nodes stays float32.
    """
    kept, moved = [], 0
    for node in model.graph.node:
        values = [a for a in node.attribute if a.name == "value"]
        if node.op_type == "Constant" and len(node.attribute) == 1 and values:
            tensor = model.graph.initializer.add()
            tensor.CopyFrom(values[0].t)
            tensor.name = node.output[0]
            moved += 1
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return moved


def _cast_to(node, to: int) -> bool:
    return node.op_type == "Cast" and any(a.name == "to" and a.i == to for a in node.attribute)


def drop_cast_pairs(model, float32_nodes: Collection[str]) -> int:
    """Remove, in place, the fp16 round trips the converter puts between float32 nodes; returns the pairs removed.

    ``convert_float_to_float16`` (ONNX Runtime's copy) gives every float tensor an fp16 type, so a kept node's output
    is Cast to fp16 and Cast back to float32 before a kept consumer (onnxconverter-common's float16 module removes
    these with ``remove_unnecessary_cast_node``; ONNX Runtime's copy does not). A Cast back that makes a graph
    output becomes a float32 copy of its source; any other is bypassed; a Cast to fp16 left unread is dropped.
    """
    from onnx import TensorProto

    graph, kept = model.graph, set(float32_nodes)
    producers = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}
    pairs, renames = 0, {}
    for down in list(graph.node):
        up = producers.get(down.input[0]) if _cast_to(down, TensorProto.FLOAT) else None
        source = producers.get(up.input[0]) if up is not None and _cast_to(up, TensorProto.FLOAT16) else None
        if source is None or source.name not in kept:
            continue
        pairs += 1
        if down.output[0] in outputs:
            down.input[0] = up.input[0]
        else:
            renames[down.output[0]] = up.input[0]
            graph.node.remove(down)
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
    read = {name for node in graph.node for name in node.input} | outputs
    for node in [n for n in graph.node if _cast_to(n, TensorProto.FLOAT16) and n.output[0] not in read]:
        graph.node.remove(node)
    return pairs


def emulated_fp16(model, float32_nodes: Collection[str], float_tensors: Sequence[str]):
    """A float32 copy of ``model`` (its Constants already initializers) that rounds as its fp16 conversion would.

    Every node not in ``float32_nodes`` reads its float initializers rounded to fp16 as the converter rounds them
    (clamped to +-65504; Resize's scales stay float32), and each of its outputs in ``float_tensors`` passes through
    a Cast to fp16 and back: fp16 storage, float32 arithmetic, as cuDNN's fp16 convolutions accumulate. A kept
    node's output is rounded too where a node outside ``float32_nodes`` reads it (the converter's Cast at the
    float32-to-fp16 boundary); where only kept nodes (or the graph's output) read it, it stays float32.
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.transformers.float16 import ALWAYS_FLOAT_INPUTS, convert_np_to_float16

    model = copy.deepcopy(model)
    graph, floats = model.graph, set(float_tensors)
    initializers = {t.name: t for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name)
    kept_nodes = set(float32_nodes)
    rounded, nodes = set(), []
    for node in graph.node:
        nodes.append(node)
        kept = node.name in kept_nodes
        for index, name in enumerate(node.input if not kept else ()):
            if name in initializers and name not in rounded and index not in ALWAYS_FLOAT_INPUTS.get(node.op_type, ()):
                values = numpy_helper.to_array(initializers[name])
                half = convert_np_to_float16(values.reshape(-1)).astype(np.float32).reshape(values.shape)
                initializers[name].CopyFrom(numpy_helper.from_array(half, name))
                rounded.add(name)
        for index, name in enumerate(list(node.output)):
            if name in floats and (not kept or readers.get(name, set()) - kept_nodes):
                node.output[index] = f"{name}_emulated_f32"
                nodes += [helper.make_node("Cast", [f"{name}_emulated_f32"], [f"{name}_emulated_f16"], to=TensorProto.FLOAT16),
                          helper.make_node("Cast", [f"{name}_emulated_f16"], [name], to=TensorProto.FLOAT)]
    del graph.node[:]
    graph.node.extend(nodes)
    return model
