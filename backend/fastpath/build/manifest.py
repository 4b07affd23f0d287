"""Artifact manifests: what was built, from what, with which tools, and each file's sha256.

A manifest (``manifest.json``) sits in each model version directory. :func:`verify_manifest`
refuses a directory whose files are missing or differ from their recorded checksums.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastpath.errors import ArtifactError

MANIFEST_NAME = "manifest.json"


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in ``chunk_bytes`` chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path, files: Iterable[str], metadata: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` listing ``files`` (names inside ``directory``) with their sha256.

    Returns:
        The manifest path.
    """
    manifest = dict(metadata)
    manifest["files"] = {name: sha256_file(directory / name) for name in sorted(files)}
    path = directory / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    """Load a directory's manifest.

    Raises:
        ArtifactError: the manifest is missing or not JSON.
    """
    path = directory / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; build the artifacts with 'fastpath build'") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); rebuild with 'fastpath build'") from None


def verify_manifest(directory: Path) -> dict[str, Any]:
    """Check every file listed in the manifest exists and matches its sha256.

    Returns:
        The manifest.

    Raises:
        ArtifactError: naming the first missing or mismatching file, with expected and actual hashes.
    """
    manifest = read_manifest(directory)
    for name, expected in manifest.get("files", {}).items():
        path = directory / name
        if not path.is_file():
            raise ArtifactError(f"{path} is listed in {MANIFEST_NAME} but missing; rebuild with 'fastpath build'")
        actual = sha256_file(path)
        if actual != expected:
            raise ArtifactError(
                f"{path} fails its checksum: sha256 {actual[:16]}..., manifest says {expected[:16]}...; "
                "the file is corrupt or was changed after the build"
            )
    return manifest
