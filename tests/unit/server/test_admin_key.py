"""Where the admin key comes from for the tools that talk to a local tritonserver: the liveness check
(``python -m fastpath.server.stubs --check``), the unload hook and ``fastpath swap | rollback | status``."""

from __future__ import annotations

import pytest

from fastpath.server import triton_api
from fastpath.server.triton_api import ADMIN_HEADER, RepositoryApi, find_admin_key


@pytest.fixture
def key_dir(tmp_path, monkeypatch):
    """Key files under a temporary ``admin_key`` location, and no FASTPATH_ADMIN_KEY in the environment."""
    monkeypatch.setattr(triton_api, "ADMIN_KEY_FILE", tmp_path / "admin_key")
    monkeypatch.delenv("FASTPATH_ADMIN_KEY", raising=False)
    return tmp_path


def test_the_environment_wins_over_every_key_file(key_dir, monkeypatch):
    """FASTPATH_ADMIN_KEY, when set, is the key whatever files `fastpath serve` left."""
    (key_dir / "admin_key.18100").write_text("from-the-port-file\n")
    monkeypatch.setenv("FASTPATH_ADMIN_KEY", "from-the-environment")
    assert find_admin_key(18100) == "from-the-environment"


def test_the_port_file_wins_over_the_latest(key_dir):
    """Without the variable, the key `fastpath serve` wrote for that port (admin_key.<port>) is used, not the latest
    server's (admin_key), so a check of one server does not send another server's key."""
    (key_dir / "admin_key.18100").write_text("port-18100\n")
    (key_dir / "admin_key").write_text("latest\n")
    assert find_admin_key(18100) == "port-18100"
    assert find_admin_key("18100") == "port-18100"
    assert find_admin_key(8000) == "latest"


def test_no_key_anywhere_is_none(key_dir):
    """No variable and no file: None, and the repository API client sends no admin header."""
    assert find_admin_key(8000) is None
    assert RepositoryApi.from_environment(8000).headers == {}


def test_the_liveness_check_sends_the_port_files_key(key_dir):
    """The liveness check's client (RepositoryApi.from_environment) carries the key of `fastpath serve`'s file for
    its port in the admin header: a default `make serve` restricts the repository index the check reads to it."""
    (key_dir / "admin_key.18100").write_text("port-18100\n")
    api = RepositoryApi.from_environment(18100)
    assert api.base == "http://127.0.0.1:18100"
    assert api.headers == {ADMIN_HEADER: "port-18100"}
