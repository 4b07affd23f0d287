"""Atomic publication of a model version directory.

A reader (Triton, or a standby slot) must never see a half-written version: the files are copied
into a staging directory beside the target (same filesystem), the manifest checksums are verified
there, and one ``rename(2)`` makes the whole directory appear at once. Staging directories start
with a dot and are not numeric, so Triton never takes them for a version.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fastpath.errors import ArtifactError
from fastpath.manifest import give_default_mode, verify_manifest


def publish_version(source: Path, model_dir: Path, version: int, *, replace: bool = False) -> Path:
    """Publish ``source`` (a directory with a manifest) as ``model_dir/<version>``.

    Args:
        source: directory holding the artifacts and ``manifest.json``.
        model_dir: the model's directory in the model repository.
        version: the Triton version number (>= 1).
        replace: replace an existing version directory (the old one is moved aside, then deleted).

    Returns:
        The published directory; it and its files have the umask's default modes (0o777 / 0o666 less the
        umask), whatever modes ``source`` had.

    Raises:
        ArtifactError: the version exists (and not ``replace``), or the manifest does not verify
            (the staging copy is removed; nothing is published).
    """
    if version < 1:
        raise ArtifactError(f"version {version} is not a Triton version number; use 1 or more")
    target = model_dir / str(version)
    if target.exists() and not replace:
        raise ArtifactError(f"{target} already exists; publish under a new version number or pass replace=True")
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{version}-", dir=model_dir))
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        give_default_mode(staging)  # mkdtemp made it 0o700: the version must be readable as a plain directory is
        verify_manifest(staging)
        for path in staging.rglob("*"):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        if target.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".retired-{version}-", dir=model_dir))
            os.rename(target, trash / "old")
            os.rename(staging, target)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
