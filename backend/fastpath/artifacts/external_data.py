"""A copy of an ONNX artifact with its weights in a separate file (ONNX external data), for fast loads.

ONNX Runtime parses the whole protobuf and copies every weight out of it when it loads an ONNX file
with the weights inline: for all-MiniLM-L6-v2 fp32 (90 MB) on 2 cores that is 0.13-0.19 s of
session creation. With the same tensors in ``model.external.onnx.data`` beside a 0.1 MB graph it
maps them from the file instead: 0.05 s (int8: 0.12 -> 0.05 s), outputs bit-identical. Session
creation is most of what a live swap still costs (docs/design/hot-swap.md).

``model.onnx`` stays the canonical artifact (quantization, TensorRT and the accuracy reports read
it). The copy is derived from it and listed in the manifest (sha256 and size of both files, like
every artifact) with the sha256 of the ``model.onnx`` it was made from, under ``external_data``;
:func:`fastpath.manifest.external_data_artifact` (the reader serving uses) returns the copy only while that source is the manifest's current
``model.onnx``, so a version whose ``model.onnx`` was replaced and re-listed never loads a stale copy.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastpath.artifacts.staging import staging_dir
from fastpath.manifest import external_data_artifact, give_default_mode, read_manifest, verify_manifest, write_manifest

GRAPH_NAME = "model.external.onnx"
DATA_NAME = "model.external.onnx.data"
SIZE_THRESHOLD_BYTES = 1024  # smaller tensors stay in the graph file


def add_external_data_copy(version_dir: Path, source: str = "model.onnx") -> bool:
    """Write the external-data copy of ``version_dir/source`` and list it in the manifest.

    The version's manifest is verified first (the copy is made only from verified bytes); the two
    files are written under temporary names and renamed into place before the manifest lists them.

    Args:
        version_dir: a built version directory with a manifest listing ``source``.
        source: the inline ONNX artifact.

    Returns:
        True when a copy was written; False when a current copy was already listed.

    Raises:
        fastpath.errors.ArtifactError: the version does not verify.
    """
    import onnx

    manifest = verify_manifest(version_dir, required=(source,))
    if external_data_artifact(manifest, source) is not None:
        return False
    source_sha256 = manifest["files"][source]
    model = onnx.load(str(version_dir / source))
    with staging_dir(version_dir, "external") as staging_name:
        staging = Path(staging_name)
        onnx.save_model(model, str(staging / GRAPH_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=DATA_NAME, size_threshold=SIZE_THRESHOLD_BYTES)
        for name in (DATA_NAME, GRAPH_NAME):
            give_default_mode(staging / name)  # onnx writes the data file 0o600
            os.replace(staging / name, version_dir / name)
    manifest = read_manifest(version_dir)
    files = set(manifest.pop("files")) | {GRAPH_NAME, DATA_NAME}
    manifest.pop("sizes", None)
    manifest["external_data"] = {"file": GRAPH_NAME, "data": DATA_NAME, "source": source, "source_sha256": source_sha256}
    write_manifest(version_dir, files, manifest)
    return True
