"""fp16 candidates of text_detection's GPU artifact, with the nodes fp16 cannot carry kept in float32.

On the CPU: :func:`measure_ranges` runs ``model.onnx`` (fp32) with ONNX Runtime's CPU EP on real photos at their
served shapes and records each intermediate tensor's largest magnitude; :func:`choose_fp32_nodes` keeps in float32
every node with an input, weight or output above a bound; :func:`write_fp16` converts ``model.uint8.onnx`` (what the
GPU engine runs) with ``onnxruntime.transformers.float16``, uint8 in and the float32 map out.

Why the naive conversion fails: the running variance of the DB head's first BatchNormalization
(``p2o.BatchNormalization.1``, ``batch_norm_0.w_2``) is 1.0e7-9.8e7, beyond fp16; the converter clamps it to 65504,
so that node divides by ~256 instead of ~3,000-10,000 and every later tensor is wrong. Kept in float32 (with its
input conv, ~29,000 at most), the map is close, yet fp16 rounding anywhere in the backbone, the input included,
still moves DB's integer box corners (:func:`emulated_screen`, :func:`fastpath.artifacts.fp16_graph.emulated_fp16`):
hence :data:`CANDIDATES`, compared on a GPU by benchmarks/gpu/detection_precision.py.
``python -m fastpath.artifacts.detection_fp16 --help`` builds them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fastpath.artifacts.fp16_graph import constants_to_initializers, drop_cast_pairs, emulated_fp16, float_activations
from fastpath.errors import ArtifactError
from fastpath.models.text_detection.config import UINT8_ARTIFACT
from fastpath.models.text_detection.preprocess import normalize_into, resize_image, resized_shape

FP16_MAX = 65504.0  # float16's largest finite value: anything larger becomes inf (or is clamped by the converter)
# A quarter of FP16_MAX. The analysis sees a few photos; a tensor above 2^14 on them is within 4x of overflowing on
# another (the head conv's maxima spread 2.7x over the four analysis photos), and from 2^14 up fp16 steps by 16.
FP16_SAFE_BOUND = 2.0**14
ANALYSIS_PHOTOS = ("text.png", "page.png", "coffee.png", "chelsea.png")  # scikit-image's photos, 2 of text
ANALYSIS_LIMIT = ("min", 736)  # configs/gpu.pbtxt's resize policy: (limit_type, limit_side_len_px)
ANALYSIS_MAX_PIXELS = 736 * 1312  # a 1280x720 frame's served shape: keeps the analysis to seconds on 2 cores
FP16_ARTIFACT = "model.uint8.fp16.onnx"  # written as model.uint8.fp16.<candidate>.onnx per candidate
CANDIDATE_GLOB = FP16_ARTIFACT.replace(".onnx", ".*.onnx")  # every candidate's file in a folder
# The first of PPLCNetV3's four stage-output 1x1 convs (its det ``layer_list``), which feed the neck (RSEFPN): the
# nodes before it are the stages that range_backbone keeps in float32
NECK_FIRST_NODE = "p2o.Conv.33"
CANDIDATES = {
    "overflow": "nodes with a tensor above fp16's largest finite value (FP16_MAX)",
    "range": "nodes with a tensor above FP16_SAFE_BOUND",
    "range_backbone": "range, and the uint8 front and backbone (every node before NECK_FIRST_NODE): fp16 in the neck and head",
}
# built by default (2.5 + 4.2 MB, small enough to travel beside the GPU bundle); overflow differs from range only
# by the head's first conv (p2o.Conv.61) in fp16
DEFAULT_CANDIDATES = ("range", "range_backbone")


@dataclasses.dataclass(frozen=True)
class TensorRange:
    """One activation of the fp32 network over the analysis photos: ``max_abs`` the largest |x| (inf when any value
    was not finite, ``finite`` False then), ``node``/``op_type`` its producer."""

    node: str
    op_type: str
    max_abs: float
    finite: bool


def analysis_images(names: Sequence[str] = ANALYSIS_PHOTOS) -> list[np.ndarray]:
    """uint8 RGB [H, W, 3] of photos shipped in scikit-image's wheel (``skimage/data/<name>``; read with Pillow).

    Raises:
        ArtifactError: scikit-image is not installed or lacks a photo.
    """
    from PIL import Image

    spec = importlib.util.find_spec("skimage")
    if spec is None or spec.origin is None:
        raise ArtifactError("scikit-image is not installed (its photos are the analysis images); pip install scikit-image")
    paths = [Path(spec.origin).parent / "data" / name for name in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ArtifactError(f"photos missing from scikit-image: {', '.join(missing)}")
    return [np.ascontiguousarray(np.asarray(Image.open(p).convert("RGB"))) for p in paths]


def measure_ranges(model_path: Path, images: Sequence[np.ndarray]) -> dict[str, TensorRange]:
    """Largest |x| of every float32 activation of ``model_path`` (input ``x`` float32 [1, 3, h, w]) over ``images``.

    Each image (uint8 RGB) is resized under :data:`ANALYSIS_LIMIT`, capped at :data:`ANALYSIS_MAX_PIXELS`, and
    normalized as served. The graph gets ``ReduceMax(Abs(t))`` and ``ReduceSum(t - t)`` (NaN when ``t`` holds an
    inf or NaN) per tensor, so only scalars leave ONNX Runtime; optimizations are off, so no fusion hides a tensor.

    Raises:
        ArtifactError: the model's input is not ``x`` [B, 3, h, w].
    """
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path))
    if [i.name for i in model.graph.input] != ["x"]:
        raise ArtifactError(f"{model_path}: expected the fp32 network with one input x [B, 3, h, w] (model.onnx)")
    tensors = float_activations(model)
    del model.graph.output[:]
    for index, (tensor, _, _) in enumerate(tensors):
        model.graph.node.extend([
            helper.make_node("Abs", [tensor], [f"range{index}_abs"]),
            helper.make_node("ReduceMax", [f"range{index}_abs"], [f"range{index}_max"], keepdims=0),
            helper.make_node("Sub", [tensor, tensor], [f"range{index}_zero"]),
            helper.make_node("ReduceSum", [f"range{index}_zero"], [f"range{index}_nan"], keepdims=0),
        ])
        model.graph.output.extend(helper.make_tensor_value_info(f"range{index}_{kind}", TensorProto.FLOAT, [])
                                  for kind in ("max", "nan"))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    maxima, finite = np.zeros(len(tensors)), np.ones(len(tensors), bool)
    for image in images:
        shape = resized_shape(*image.shape[:2], ANALYSIS_LIMIT[1], ANALYSIS_LIMIT[0], ANALYSIS_MAX_PIXELS)
        feed = normalize_into(resize_image(image, shape), np.empty((3, *shape), np.float32))[None]
        outputs = np.asarray(session.run(None, {"x": feed}), np.float64).reshape(-1, 2)
        finite &= np.isfinite(outputs[:, 1]) & np.isfinite(outputs[:, 0])
        maxima = np.maximum(maxima, np.nan_to_num(outputs[:, 0], nan=np.inf))
    return {tensor: TensorRange(node, op, float(top) if ok else math.inf, bool(ok))
            for (tensor, node, op), top, ok in zip(tensors, maxima, finite)}


def weight_maxima(model) -> dict[str, float]:
    """Largest |x| of every float32 initializer and Constant node output of ``model`` (0.0 for an empty one)."""
    from onnx import TensorProto, numpy_helper

    named = [(t.name, t) for t in model.graph.initializer]
    named += [(n.output[0], a.t) for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    return {name: float(np.abs(numpy_helper.to_array(t)).max(initial=0.0)) for name, t in named if t.data_type == TensorProto.FLOAT}


def choose_fp32_nodes(model, ranges: Mapping[str, TensorRange], bound: float = FP16_SAFE_BOUND) -> list[str]:
    """Names of the nodes of ``model`` to keep in float32, in graph order: every node (Constants aside) with an
    input, output or weight whose largest |x| (``ranges`` for activations, :func:`weight_maxima` for weights) is
    above ``bound`` or not finite. Tensors of neither (integers, the uint8 front's) never block a node.

    Raises:
        ArtifactError: a node to keep has no name (the converter blocks nodes by name).
    """
    weights = weight_maxima(model)
    chosen = []
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        values = [ranges[t].max_abs if t in ranges else weights.get(t, 0.0) for t in [*node.input, *node.output] if t]
        if any(not math.isfinite(v) or v > bound for v in values):
            if not node.name:
                raise ArtifactError(f"a {node.op_type} node producing {list(node.output)} must stay float32 but has no name")
            chosen.append(node.name)
    return chosen


def backbone_nodes(model) -> list[str]:
    """Names of the nodes before :data:`NECK_FIRST_NODE` (the uint8 front and PPLCNetV3), Constants aside, in order.

    Raises:
        ArtifactError: ``model`` has no node of that name.
    """
    names = [n.name for n in model.graph.node if n.op_type != "Constant"]
    if NECK_FIRST_NODE not in names:
        raise ArtifactError(f"the model has no node {NECK_FIRST_NODE}: not PP-OCRv4 det as exported by paddle2onnx")
    return names[: names.index(NECK_FIRST_NODE)]


def candidate_block_list(name: str, model, ranges: Mapping[str, TensorRange]) -> list[str]:
    """The float32 nodes of candidate ``name`` (one of :data:`CANDIDATES`) for ``model``, in graph order.

    Raises:
        ArtifactError: an unknown candidate.
    """
    if name == "overflow":
        return choose_fp32_nodes(model, ranges, FP16_MAX)
    if name == "range":
        return choose_fp32_nodes(model, ranges, FP16_SAFE_BOUND)
    if name == "range_backbone":
        chosen = set(choose_fp32_nodes(model, ranges, FP16_SAFE_BOUND) + backbone_nodes(model))
        return [n.name for n in model.graph.node if n.name in chosen]
    raise ArtifactError(f"unknown fp16 candidate {name!r}; one of {', '.join(CANDIDATES)}")


def write_fp16(source: Path, target: Path, node_block_list: Sequence[str]) -> Path:
    """Convert ``source`` (``model.uint8.onnx``) to fp16 but for ``node_block_list``, uint8 in and float32 map out.

    Uses ``onnxruntime.transformers.float16.convert_float_to_float16`` (``keep_io_types``, the library's default
    op block list) after :func:`constants_to_initializers`, then :func:`drop_cast_pairs`; sorts the nodes (the
    library's Casts come last) and checks the result with ``onnx.checker``.

    Raises:
        ArtifactError: a name in ``node_block_list`` is not a node of ``source``.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = onnx.load(str(source))
    unknown = set(node_block_list) - {n.name for n in model.graph.node}
    if unknown:
        raise ArtifactError(f"{source} has no nodes named {sorted(unknown)}; was the block list made for another model?")
    constants_to_initializers(model)
    converted = convert_float_to_float16(model, keep_io_types=True, node_block_list=list(node_block_list))
    drop_cast_pairs(converted, node_block_list)
    OnnxModel.graph_topological_sort(converted.graph, is_deterministic=True)  # the converter appends its Casts last
    onnx.checker.check_model(converted)
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(converted, str(target))
    return target


def emulated_screen(uint8_path: Path, block_lists: Mapping[str, Sequence[str]], images: Sequence[np.ndarray],
                    binary_threshold: float = 0.3) -> dict[str, dict]:
    """Per block list, how far its fp16 map is from the float32 one on ``images``, emulated on the CPU.

    Each image runs through ``uint8_path`` and through :func:`~fastpath.artifacts.fp16_graph.emulated_fp16` of it
    (ONNX Runtime's CPU EP does not run an fp16 graph as a GPU does) at the analysis shape. Returns per name: mean
    and largest |map difference|, and the pixels on opposite sides of ``binary_threshold`` (DB's), all images together.
    """
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(uint8_path))
    constants_to_initializers(model)
    floats = [tensor for tensor, _, _ in float_activations(model)]
    feeds = []
    for image in images:
        shape = resized_shape(*image.shape[:2], ANALYSIS_LIMIT[1], ANALYSIS_LIMIT[0], ANALYSIS_MAX_PIXELS)
        feeds.append({model.graph.input[0].name: resize_image(image, shape)[None]})
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    maps = [reference.run(None, feed)[0] for feed in feeds]
    report = {}
    for name, block in block_lists.items():
        emulated = emulated_fp16(model, set(block), floats).SerializeToString()
        session = ort.InferenceSession(emulated, providers=["CPUExecutionProvider"])
        outs = [session.run(None, feed)[0] for feed in feeds]
        diffs = [np.abs(out - ref) for out, ref in zip(outs, maps)]
        report[name] = {"mean_abs_diff": float(np.mean([d.mean() for d in diffs])), "max_abs_diff": float(max(d.max() for d in diffs)),
                        "pixels_flipped": sum(int(((o >= binary_threshold) != (r >= binary_threshold)).sum()) for o, r in zip(outs, maps)),
                        "pixels": sum(d.size for d in diffs)}
    return report


def candidate_path(out_dir: Path, name: str) -> Path:
    """``<out_dir>/model.uint8.fp16.<name>.onnx``."""
    return Path(out_dir) / FP16_ARTIFACT.replace(".onnx", f".{name}.onnx")


def candidate_name(path: Path) -> str:
    """The candidate of a :func:`candidate_path` file: ``range`` for ``model.uint8.fp16.range.onnx``."""
    return Path(path).name[len(FP16_ARTIFACT) - len("onnx"):-len(".onnx")]


def build_candidates(version_dir: Path, out_dir: Path, names: Sequence[str] = DEFAULT_CANDIDATES, screen: bool = True) -> dict:
    """Measure the ranges of ``version_dir``'s ``model.onnx``, write one fp16 model per candidate from its
    ``model.uint8.onnx`` into ``out_dir``, and ``out_dir/fp16_candidates.json``: the block lists, the tensors above
    :data:`FP16_SAFE_BOUND`, the weights above :data:`FP16_MAX` and, with ``screen``, :func:`emulated_screen` of
    each candidate and of the naive conversion (nothing in float32). Returns that report.

    Raises:
        ArtifactError: an artifact or photo is missing, or an unknown candidate.
    """
    import onnx

    version_dir, out_dir = Path(version_dir), Path(out_dir)
    names = [name.strip() for name in names]
    unknown = [name for name in names if name not in CANDIDATES]
    if unknown:  # before the range analysis (seconds)
        raise ArtifactError(f"unknown fp16 candidates {unknown}; expected some of {', '.join(CANDIDATES)}")
    source, uint8 = version_dir / "model.onnx", version_dir / UINT8_ARTIFACT
    for path in (source, uint8):
        if not path.is_file():
            raise ArtifactError(f"{path} is missing; build the artifacts with 'fastpath build'")
    images = analysis_images()
    ranges = measure_ranges(source, images)
    model = onnx.load(str(uint8))
    report = {"bound": FP16_SAFE_BOUND, "photos": list(ANALYSIS_PHOTOS), "limit": list(ANALYSIS_LIMIT),
              "max_resized_pixels": ANALYSIS_MAX_PIXELS, "tensors": len(ranges),
              "above_bound": {t: dataclasses.asdict(r) for t, r in ranges.items() if not r.max_abs <= FP16_SAFE_BOUND},
              "weights_above_fp16_max": {t: v for t, v in weight_maxima(model).items() if v > FP16_MAX},
              "largest": sorted(((r.max_abs, t) for t, r in ranges.items()), reverse=True)[:10], "candidates": {}}
    for name in names:
        block = candidate_block_list(name, model, ranges)
        path = write_fp16(uint8, candidate_path(out_dir, name), block)
        report["candidates"][name] = {"file": path.name, "what": CANDIDATES[name], "node_block_list": block,
                                      "bytes": path.stat().st_size}
    if screen:
        lists = {"naive": [], **{name: c["node_block_list"] for name, c in report["candidates"].items()}}
        report["emulated_screen"] = emulated_screen(uint8, lists, images)
    (out_dir / "fp16_candidates.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fastpath.artifacts.detection_fp16 --version-dir DIR --out DIR [--candidates a,b]``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version-dir", type=Path, default=Path("model_repository/text_detection/1"))
    parser.add_argument("--out", type=Path, required=True, help="the folder the candidates and fp16_candidates.json go to")
    parser.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES), help=f"comma-separated, of {', '.join(CANDIDATES)}")
    parser.add_argument("--no-screen", action="store_true", help="skip the emulated fp16 maps (~30 s on 2 cores)")
    args = parser.parse_args(argv)
    report = build_candidates(args.version_dir, args.out, args.candidates.split(","), screen=not args.no_screen)
    print(f"{report['tensors']} tensors; above {FP16_SAFE_BOUND:g}: {sorted(report['above_bound'])}; "
          f"weights above {FP16_MAX:g}: {sorted(report['weights_above_fp16_max'])}")
    for name, candidate in report["candidates"].items():
        print(f"{name}: {candidate['file']} ({candidate['bytes'] / 1e6:.2f} MB), {len(candidate['node_block_list'])} float32 nodes")
    for name, row in report.get("emulated_screen", {}).items():
        print(f"emulated {name}: map |diff| mean {row['mean_abs_diff']:.2e} max {row['max_abs_diff']:.2e}, "
              f"{row['pixels_flipped']} of {row['pixels']} pixels across DB's threshold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
