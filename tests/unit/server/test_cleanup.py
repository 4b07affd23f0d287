"""remove_stale_shm: python-backend shared-memory regions left by a killed server, on real /dev/shm files."""

from __future__ import annotations

import mmap
import os
import time
import uuid
from pathlib import Path

import pytest

from fastpath.server.cleanup import SHM_GLOB, remove_stale_shm

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")


def _region(age_s: float) -> Path:
    path = Path("/dev/shm") / SHM_GLOB.replace("*", f"test-{uuid.uuid4()}")
    path.write_bytes(b"\0" * 4096)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


def test_only_old_regions_no_process_maps_are_removed():
    stale, fresh, mapped = _region(3600), _region(0), _region(3600)
    with open(mapped, "r+b") as handle, mmap.mmap(handle.fileno(), 4096) as _view:  # a live server's region
        try:
            removed = remove_stale_shm(min_age_s=60)
            assert str(stale) in removed and not stale.exists()
            assert fresh.exists() and mapped.exists()  # too new (a server starting now), and mapped
        finally:
            for path in (stale, fresh, mapped):
                path.unlink(missing_ok=True)
