"""The text-detection artifact: PP-OCRv4 det ONNX from the ``rapidocr-onnxruntime`` wheel.

The wheel ships ``rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx`` (4.7 MB, input ``x``
float32 [batch, 3, height, width] with every dimension but channels dynamic, output
``sigmoid_0.tmp_0`` float32 [batch, 1, height, width]). The build copies it into
``<repository>/text_detection/1/model.onnx`` with a manifest (source package, version, sha256).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path

from fastpath.artifacts.manifest import MANIFEST_NAME, sha256_file, write_manifest
from fastpath.errors import ArtifactError

SOURCE_PACKAGE = "rapidocr-onnxruntime"
SOURCE_MODULE = "rapidocr_onnxruntime"
SOURCE_FILE = "models/ch_PP-OCRv4_det_infer.onnx"
MODEL_NAME = "text_detection"
ARTIFACT = "model.onnx"
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
    return all((version_dir / name).is_file() for name in (ARTIFACT, MANIFEST_NAME))


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
    with tempfile.TemporaryDirectory(dir=version_dir.parent, prefix=".staging-") as staging_name:
        staging = Path(staging_name)
        shutil.copyfile(source, staging / ARTIFACT)
        write_manifest(
            staging,
            [ARTIFACT],
            {
                "model": "PP-OCRv4 text detection (DB), ch_PP-OCRv4_det_infer",
                "source": {"package": SOURCE_PACKAGE, "version": md.version(SOURCE_PACKAGE), "file": SOURCE_FILE,
                           "sha256": sha256_file(source)},
                "precision": "fp32",
                "artifact": ARTIFACT,
                "inputs": ["x"],
                "output": "sigmoid_0.tmp_0",
            },
        )
        for name in (ARTIFACT, MANIFEST_NAME):
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
