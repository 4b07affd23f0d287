"""Staging directories of ``fastpath build``, named after the process that made them.

Each build step writes into a directory ``.build-<step>-<pid>-<random>`` beside (or in) the version it builds and
moves the finished files into place. Ctrl-C and SIGTERM unwind and remove it; a build killed with SIGKILL cannot,
so the next build removes every staging directory whose builder no longer runs (:func:`remove_abandoned`).
Triton skips these directories: a version is a directory named by a number.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fastpath.processes import process_running

BUILD_PREFIX = ".build-"


def staging_dir(parent: Path, step: str) -> tempfile.TemporaryDirectory:
    """A temporary directory in ``parent`` named ``.build-<step>-<this pid>-<random>`` (a context manager)."""
    return tempfile.TemporaryDirectory(prefix=f"{BUILD_PREFIX}{step}-{os.getpid()}-", dir=parent)


def remove_abandoned(repository: Path) -> list[Path]:
    """Remove the staging directories in ``repository``'s model and version directories whose builder no longer
    runs; returns them. One whose builder runs (a build beside this one) is left alone."""
    removed = []
    for path in sorted([*repository.glob(f"*/{BUILD_PREFIX}*"), *repository.glob(f"*/*/{BUILD_PREFIX}*")]):
        try:
            pid = int(path.name.rsplit("-", 2)[1])
        except (IndexError, ValueError):
            continue
        if path.is_dir() and not path.is_symlink() and not process_running(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
