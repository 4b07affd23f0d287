"""The text-detection artifact: PP-OCRv4 det ONNX from the ``rapidocr-onnxruntime`` wheel.

The wheel ships ``rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx`` (4.7 MB, input ``x``
float32 [batch, 3, height, width] with every dimension but channels dynamic, output
``sigmoid_0.tmp_0`` float32 [batch, 1, height, width]). The build copies it into
``<repository>/text_detection/1/model.onnx`` with a manifest (source package, version, sha256), and
writes ``model.uint8.onnx`` beside it: the same network behind a front that takes the images as they
are staged for a GPU, uint8 RGB [batch, height, width, 3], and normalizes them inside the graph
(:func:`uint8_front`), so only a quarter of the float32 bytes cross PCIe and the normalization runs on
the device.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import logging
import shutil
from pathlib import Path

from fastpath.artifacts.staging import staging_dir
from fastpath.errors import ArtifactError
from fastpath.manifest import MANIFEST_NAME, sha256_file, write_manifest
from fastpath.models.text_detection.config import UINT8_ARTIFACT

SOURCE_PACKAGE = "rapidocr-onnxruntime"
SOURCE_MODULE = "rapidocr_onnxruntime"
SOURCE_FILE = "models/ch_PP-OCRv4_det_infer.onnx"
MODEL_NAME = "text_detection"
ARTIFACT = "model.onnx"
UINT8_INPUT = "image"
LOG = logging.getLogger("fastpath")


def source_model_path() -> Path:
    """The detection ONNX inside the installed rapidocr-onnxruntime package (not imported).

    Raises:
        ArtifactError: the package or the file is missing.
    """
    spec = importlib.util.find_spec(SOURCE_MODULE)
    if spec is None or spec.origin is None:
        raise ArtifactError(f"the {SOURCE_PACKAGE} package is not installed; pip install -e '.[build]'")
    path = Path(spec.origin).parent / SOURCE_FILE
    if not path.is_file():
        raise ArtifactError(f"{path} is missing from the installed {SOURCE_PACKAGE} {md.version(SOURCE_PACKAGE)}")
    return path


def text_detection_version_dir(repository: Path) -> Path:
    """``<repository>/text_detection/1``."""
    return Path(repository) / MODEL_NAME / "1"


def text_detection_present(repository: Path) -> bool:
    """True when the artifact and its manifest exist (``fastpath build --if-missing`` skips then)."""
    version_dir = text_detection_version_dir(repository)
    return all((version_dir / name).is_file() for name in (ARTIFACT, UINT8_ARTIFACT, MANIFEST_NAME))


def build_text_detection(repository: Path) -> Path:
    """Copy the PP-OCRv4 det ONNX into the model repository atomically, with a manifest.

    Args:
        repository: the model repository directory (holds ``text_detection/config.pbtxt``).

    Returns:
        Path of the written ``model.onnx``.

    Raises:
        ArtifactError: the source package or file is missing.
    """
    source = source_model_path()
    version_dir = text_detection_version_dir(repository)
    version_dir.mkdir(parents=True, exist_ok=True)
    with staging_dir(version_dir.parent, "detection") as staging_name:
        staging = Path(staging_name)
        shutil.copyfile(source, staging / ARTIFACT)
        uint8_front(staging / ARTIFACT, staging / UINT8_ARTIFACT)
        write_manifest(
            staging,
            [ARTIFACT, UINT8_ARTIFACT],
            {
                "model": "PP-OCRv4 text detection (DB), ch_PP-OCRv4_det_infer",
                "source": {"package": SOURCE_PACKAGE, "version": md.version(SOURCE_PACKAGE), "file": SOURCE_FILE,
                           "sha256": sha256_file(source)},
                "precision": "fp32",
                "artifact": ARTIFACT,
                "inputs": ["x"],
                "output": "sigmoid_0.tmp_0",
                "uint8_artifact": {"file": UINT8_ARTIFACT, "input": f"{UINT8_INPUT} uint8 [batch, height, width, 3] RGB"},
            },
        )
        for name in (ARTIFACT, UINT8_ARTIFACT, MANIFEST_NAME):
            (staging / name).replace(version_dir / name)
    return version_dir / ARTIFACT


def ensure_text_detection(repository: Path, *, if_missing: bool) -> Path:
    """``fastpath build`` step: (re)build the artifact, or keep it when ``if_missing`` and present.

    Returns:
        Path of ``model.onnx``.
    """
    path = text_detection_version_dir(repository) / ARTIFACT
    if if_missing and text_detection_present(repository):
        LOG.info("text_detection artifact present in %s (fastpath build rebuilds it)", path.parent)
        return path
    path = build_text_detection(repository)
    LOG.info("wrote %s (%.1f MB) from %s", path, path.stat().st_size / 1e6, SOURCE_PACKAGE)
    return path


def uint8_front(source: Path, target: Path) -> Path:
    """Write ``source`` (input ``x`` float32 [B, 3, h, w], normalized BGR planes) behind a uint8 front.

    The new input ``image`` is uint8 [B, h, w, 3] RGB, what the staging pool holds. The front is
    ``Gather(NORMALIZE_LUT, Cast<int32>(image))`` (the 256 float32 values of
    :data:`~fastpath.models.text_detection.preprocess.NORMALIZE_LUT`, so every value is bit-identical
    to the CPU path's :func:`~fastpath.models.text_detection.preprocess.normalize_into`), then
    ``Transpose`` to [B, 3, h, w] and ``Gather`` of channels (2, 1, 0) for BGR. All three run on ONNX
    Runtime's CUDA EP. Output and network are unchanged.

    Raises:
        ArtifactError: ``source`` does not have exactly one input named ``x`` of rank 4.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fastpath.models.text_detection.preprocess import NORMALIZE_LUT

    model = onnx.load(str(source))
    graph = model.graph
    if len(graph.input) != 1 or len(graph.input[0].type.tensor_type.shape.dim) != 4:
        raise ArtifactError(f"{source}: expected one input [batch, 3, height, width]; got {[i.name for i in graph.input]}")
    network_input = graph.input[0].name
    dims = graph.input[0].type.tensor_type.shape.dim
    image = helper.make_tensor_value_info(UINT8_INPUT, TensorProto.UINT8, [dims[0].dim_param or dims[0].dim_value,
                                                                            dims[2].dim_param or "height",
                                                                            dims[3].dim_param or "width", 3])
    graph.initializer.extend([
        numpy_helper.from_array(NORMALIZE_LUT, "fastpath_normalize_lut"),
        numpy_helper.from_array(np.array([2, 1, 0], dtype=np.int64), "fastpath_bgr_order"),
    ])
    front = [
        helper.make_node("Cast", [UINT8_INPUT], ["fastpath_levels"], to=TensorProto.INT32, name="fastpath_cast"),
        helper.make_node("Gather", ["fastpath_normalize_lut", "fastpath_levels"], ["fastpath_rgb"], axis=0, name="fastpath_normalize"),
        helper.make_node("Transpose", ["fastpath_rgb"], ["fastpath_rgb_planes"], perm=[0, 3, 1, 2], name="fastpath_planes"),
        helper.make_node("Gather", ["fastpath_rgb_planes", "fastpath_bgr_order"], [network_input], axis=1, name="fastpath_bgr"),
    ]
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(front + nodes)
    del graph.input[:]
    graph.input.append(image)
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return target
