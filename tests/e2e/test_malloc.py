"""tritonserver runs with tcmalloc preloaded (its memory stays flat over model reloads: fastpath.server.malloc)
while its python-backend stubs keep glibc's malloc and the operator's LD_PRELOAD."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastpath.server.malloc import find_tcmalloc
from fastpath.server.process import group_members
from fastpath.server.stubs import list_stubs

pytestmark = pytest.mark.e2e


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_tritonserver_maps_tcmalloc_and_its_stubs_do_not(triton_server):
    """Invariant: the library fastpath.server.malloc finds is mapped into tritonserver, which runs with
    TCMALLOC_AGGRESSIVE_DECOMMIT true (or the operator's value); no stub maps any tcmalloc, and each stub's
    LD_PRELOAD is this test process's own (the operator's)."""
    library = find_tcmalloc(os.environ)
    if library is None:
        pytest.skip("no tcmalloc installed: make setup puts it in .venv/lib/tcmalloc (scripts/install_tcmalloc.sh)")
    assert str(library.resolve()) in _mapped(triton_server.pid) or str(library) in _mapped(triton_server.pid)
    expected = os.environ.get("TCMALLOC_AGGRESSIVE_DECOMMIT", "true")
    assert _environment(triton_server.pid).get("TCMALLOC_AGGRESSIVE_DECOMMIT") == expected
    stubs = list_stubs(group_members(triton_server.pid))
    assert {stub.model for stub in stubs} >= {"text_embedding", "fastpath_admin"}
    for stub in stubs:
        assert "tcmalloc" not in _mapped(stub.pid), f"stub {stub.instance} (pid {stub.pid}) maps tcmalloc"
        assert _environment(stub.pid).get("LD_PRELOAD") == os.environ.get("LD_PRELOAD"), stub.instance
