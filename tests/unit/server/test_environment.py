"""The environment fastpath starts tritonserver (and so every python-backend stub) with."""

from __future__ import annotations

from pathlib import Path

from fastpath.server.process import GLIBC_TUNABLES, server_environment


def test_glibc_huge_pages_are_on_unless_the_environment_sets_its_own_tunables(monkeypatch, tmp_path: Path):
    """Invariant: the child gets GLIBC_TUNABLES=glibc.malloc.hugetlb=1, and an operator's own GLIBC_TUNABLES
    is passed on unchanged."""
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert server_environment(tmp_path)["GLIBC_TUNABLES"] == GLIBC_TUNABLES == "glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert server_environment(tmp_path)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
