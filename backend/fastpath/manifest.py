"""Artifact manifests: what was built, from what, with which tools, and each file's sha256.

A manifest (``manifest.json``) sits in each model version directory. ``files`` maps each file
name to its sha256 and ``sizes`` to its length in bytes. :func:`verify_manifest` refuses a
directory whose files are missing, truncated or grown (size first, so a half-copied file is named as
such), or differ from their recorded checksums; a manifest that names a path outside its directory
is refused too.

A :class:`ChecksumCache` lets a long-running process (a serving instance taking live swaps) hash each
published file once, reusing a digest only while the file keeps its identity and metadata (device, inode,
size, mtime and ctime in ns); why that is safe, and what it cannot see: docs/design/hot-swap.md ("Checksums").

:func:`external_data_artifact` reads the manifest's ``external_data`` entry: the copy of ``model.onnx``
with its weights as ONNX external data that a live swap loads faster (written by
:mod:`fastpath.artifacts.external_data`).

Both sides use this module: ``fastpath build`` writes manifests (:mod:`fastpath.artifacts`), serving
reads and verifies them before it loads a version. It needs only the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
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


class ChecksumCache:
    """sha256 of files, each computed once per file identity (thread-safe).

    Args:
        max_entries: digests kept; the oldest is dropped beyond this (a file then is hashed again).
    """

    def __init__(self, max_entries: int = 256) -> None:
        self._digests: dict[tuple[int, ...], str] = {}
        self._lock = threading.Lock()
        self._max_entries = max_entries
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _identity(path: Path) -> tuple[int, ...]:
        info = os.stat(path)  # follows symlinks: a linked file shares its target's entry
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def sha256(self, path: Path) -> str:
        """Hex sha256 of ``path``, from the cache while its identity is unchanged.

        Raises:
            OSError: the file cannot be read.
        """
        before = self._identity(path)
        with self._lock:
            digest = self._digests.get(before)
            if digest is not None:
                self.hits += 1
                return digest
            self.misses += 1
        digest = sha256_file(path)
        if self._identity(path) == before:  # not changed while it was read: safe to remember
            with self._lock:
                self._digests[before] = digest
                while len(self._digests) > self._max_entries:
                    del self._digests[next(iter(self._digests))]
        return digest


def process_umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status`` ``Umask``, Linux 4.7+); elsewhere
    through ``os.umask``, which sets it for an instant."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_default_mode(path: Path) -> None:
    """Give ``path`` (a file, or a directory and everything under it) the mode a plain ``open`` or ``mkdir``
    gives under the process's umask: 0o666 for files and 0o777 for directories, less the umask.

    A version directory is written through temporary names (``tempfile`` makes them 0o600 and 0o700, and onnx
    writes external data 0o600), then renamed into place; without this, a server running as another user than
    the build, or a read-only shared model repository, could not read the version.
    """
    mask = process_umask()
    path = Path(path)
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in paths:
        if not item.is_symlink():
            os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


def write_manifest(directory: Path, files: Iterable[str], metadata: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` listing ``files`` (names inside ``directory``) with their sha256.

    Returns:
        The manifest path.
    """
    manifest = dict(metadata)
    names = sorted(files)
    manifest["files"] = {name: sha256_file(directory / name) for name in names}
    manifest["sizes"] = {name: (directory / name).stat().st_size for name in names}
    path = directory / MANIFEST_NAME
    temporary = directory / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)  # a reader sees the old manifest or the new one, never half of one
    return path


# How a version directory gets its artifacts and manifest: the shipped versions from `fastpath build`, any other
# copied in whole by fastpath.swaps.publish.publish_version (docs/design/hot-swap.md), never by hand
REBUILD = ("build the shipped versions with 'fastpath build'; publish any other with "
           "fastpath.swaps.publish.publish_version (docs/design/hot-swap.md)")


def read_manifest(directory: Path) -> dict[str, Any]:
    """Load a directory's manifest.

    Raises:
        ArtifactError: the manifest is missing, not UTF-8 JSON, or not a JSON object.
    """
    path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; {REBUILD}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); {REBUILD}") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path} holds a JSON {type(manifest).__name__}, not an object of files and metadata; {REBUILD}")
    return manifest


def external_data_artifact(manifest: dict[str, Any], source: str = "model.onnx") -> str | None:
    """The external-data copy's graph file name if the manifest lists a copy made from its current
    ``source`` (same sha256 as the listed ``source``), else None."""
    entry = manifest.get("external_data") or {}
    files = manifest.get("files") or {}
    if entry.get("source") != source or source not in files or entry.get("source_sha256") != files[source]:
        return None
    if entry.get("file") not in files or entry.get("data") not in files:
        return None
    return str(entry["file"])


def verify_manifest(directory: Path, *, required: Iterable[str] = (), only_required: bool = False,
                    checksums: ChecksumCache | None = None) -> dict[str, Any]:
    """Check every file listed in the manifest exists, has its recorded size and matches its sha256.

    Args:
        directory: a model version directory.
        required: file names the caller is about to load; each must be listed in the manifest
            (an unlisted file is unverified and refused).
        only_required: check just the ``required`` files (e.g. a GPU host that received the torch
            runtime's files of a version but not its 90 MB ``model.onnx``).
        checksums: reuse digests of files hashed before and unchanged since (see :class:`ChecksumCache`);
            None hashes every file.

    Returns:
        The manifest.

    Raises:
        ArtifactError: naming the first problem: an empty or unsafe file list, a required file not
            listed, a missing file, a size mismatch (truncated or grown), or a checksum mismatch
            (expected and actual hashes).
    """
    manifest = read_manifest(directory)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{directory / MANIFEST_NAME} lists no files; rebuild with 'fastpath build'")
    required = tuple(required)
    for name in required:
        if name not in files:
            raise ArtifactError(f"{directory / name} is not listed in {MANIFEST_NAME}, so it cannot be verified; rebuild with 'fastpath build'")
    sizes = manifest.get("sizes", {})
    checked = {name: files[name] for name in required} if only_required else files
    for name, expected in checked.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ArtifactError(f"{MANIFEST_NAME} in {directory} names {name!r}, outside its directory; refusing it")
        path = directory / name
        if not path.is_file():
            raise ArtifactError(f"{path} is listed in {MANIFEST_NAME} but missing; rebuild with 'fastpath build'")
        size = path.stat().st_size
        if name in sizes and size != sizes[name]:
            state = "truncated" if size < sizes[name] else "larger than built"
            raise ArtifactError(
                f"{path} is {size} bytes; {MANIFEST_NAME} says {sizes[name]}: the file is {state} "
                "(an interrupted copy or a change after the build); rebuild with 'fastpath build'"
            )
        actual = checksums.sha256(path) if checksums is not None else sha256_file(path)
        if actual != expected:
            raise ArtifactError(
                f"{path} fails its checksum: sha256 {actual[:16]}..., manifest says {expected[:16]}...; "
                "the file is corrupt or was changed after the build"
            )
    return manifest
