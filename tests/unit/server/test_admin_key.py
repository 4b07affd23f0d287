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


def test_no_home_directory_means_no_key_file(monkeypatch):
    """A probe run as a user without a home directory (Path.home raises) finds no key file instead of failing."""
    monkeypatch.setattr(triton_api, "ADMIN_KEY_FILE", None)
    monkeypatch.delenv("FASTPATH_ADMIN_KEY", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(triton_api.Path, "home", staticmethod(no_home))
    assert find_admin_key(8000) is None
    assert RepositoryApi.from_environment(8000).headers == {}


def test_the_liveness_check_sends_the_port_files_key(key_dir):
    """The liveness check's client (RepositoryApi.from_environment) carries the key of `fastpath serve`'s file for
    its port in the admin header: a default `make serve` restricts the repository index the check reads to it."""
    (key_dir / "admin_key.18100").write_text("port-18100\n")
    api = RepositoryApi.from_environment(18100)
    assert api.base == "http://127.0.0.1:18100"
    assert api.headers == {ADMIN_HEADER: "port-18100"}


def test_serve_publishes_a_generated_key_per_port_and_withdraws_it(key_dir):
    """`fastpath serve` writes a generated key 0600 for each port and as the latest once ready, and removes the
    files that still hold its key at exit; find_admin_key reads the port's file meanwhile."""
    from fastpath.cli.serve import _publish_admin_key, _withdraw_admin_key

    _publish_admin_key("generated-key", (18100, 18101))
    assert find_admin_key(18100) == find_admin_key(18101) == find_admin_key() == "generated-key"
    assert (key_dir / "admin_key.18100").stat().st_mode & 0o777 == 0o600
    _withdraw_admin_key("generated-key", (18100, 18101))
    assert sorted(p.name for p in key_dir.iterdir()) == []


def test_a_key_that_cannot_be_written_is_a_warning_not_a_failed_serve(key_dir, monkeypatch, caplog):
    """Where the key file cannot be written (here its directory is a file), serving goes on: a warning says the
    admin API is refused until FASTPATH_ADMIN_KEY is set, and nothing raises at publish or withdraw."""
    from fastpath.cli.serve import _publish_admin_key, _withdraw_admin_key

    (key_dir / "not_a_directory").write_text("")
    monkeypatch.setattr(triton_api, "ADMIN_KEY_FILE", key_dir / "not_a_directory" / "admin_key")
    with caplog.at_level("WARNING", logger="fastpath"):
        _publish_admin_key("generated-key", (18100,))
    assert "could not be written" in caplog.text and "FASTPATH_ADMIN_KEY" in caplog.text
    _withdraw_admin_key("generated-key", (18100,))
