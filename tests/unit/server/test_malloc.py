"""tritonserver's malloc (fastpath.server.malloc): tcmalloc preloaded into tritonserver alone, the operator's own
LD_PRELOAD and BASH_ENV given back to the python-backend stubs, and clear errors when it cannot be had."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fastpath.errors import ServerError
from fastpath.server import malloc


@pytest.fixture
def fake_library(tmp_path: Path) -> Path:
    """A file named as Debian's tcmalloc in a folder the search is pointed at (only its presence is read here)."""
    folder = tmp_path / "lib"
    folder.mkdir()
    (folder / malloc.LIBRARY_NAMES[0]).write_bytes(b"\x7fELF")
    return folder / malloc.LIBRARY_NAMES[0]


def test_tcmalloc_goes_first_in_ld_preload_and_the_stub_keeps_the_operators_values(tmp_path, fake_library, monkeypatch):
    """Invariant: tritonserver's LD_PRELOAD is tcmalloc then the operator's preloads; BASH_ENV names the written
    stub script; the operator's LD_PRELOAD and BASH_ENV are kept for the stubs; nothing else changes."""
    monkeypatch.setattr(malloc, "search_paths", lambda: [fake_library.parent])
    operator = {"LD_PRELOAD": "/opt/x/libprofiler.so", "BASH_ENV": "/etc/site-bash-env", "PATH": "/usr/bin"}
    env = malloc.malloc_environment(dict(operator), "auto", tmp_path)
    assert env["LD_PRELOAD"] == f"{fake_library}:/opt/x/libprofiler.so"
    assert env["BASH_ENV"] == str(tmp_path / malloc.STUB_ENV_FILE)
    assert (tmp_path / malloc.STUB_ENV_FILE).read_text() == malloc.STUB_ENV_SCRIPT
    assert env[malloc.STUB_LD_PRELOAD] == "/opt/x/libprofiler.so" and env[malloc.STUB_BASH_ENV] == "/etc/site-bash-env"
    assert env["PATH"] == "/usr/bin"
    assert env["TCMALLOC_AGGRESSIVE_DECOMMIT"] == "true"
    assert operator["LD_PRELOAD"] == "/opt/x/libprofiler.so", "the caller's dict is not changed"


def test_tcmalloc_decommits_free_spans_unless_the_operator_says_otherwise(tmp_path, fake_library, monkeypatch):
    """Invariant: with tcmalloc, TCMALLOC_AGGRESSIVE_DECOMMIT is true unless the environment already sets it, in
    which case the operator's value is kept; glibc adds no tcmalloc variable."""
    monkeypatch.setattr(malloc, "search_paths", lambda: [fake_library.parent])
    assert malloc.malloc_environment({}, "tcmalloc", tmp_path)["TCMALLOC_AGGRESSIVE_DECOMMIT"] == "true"
    kept = malloc.malloc_environment({"TCMALLOC_AGGRESSIVE_DECOMMIT": "false"}, "tcmalloc", tmp_path)
    assert kept["TCMALLOC_AGGRESSIVE_DECOMMIT"] == "false"
    assert "TCMALLOC_AGGRESSIVE_DECOMMIT" not in malloc.malloc_environment({}, "glibc", tmp_path)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("operator", [{}, {"LD_PRELOAD": "libm.so.6"}, {"LD_PRELOAD": "libm.so.6", "BASH_ENV": "SITE"}],
                         ids=["none", "ld_preload", "ld_preload_and_bash_env"])
def test_a_stub_started_as_the_python_backend_does_gets_the_operators_environment(tmp_path, fake_library, monkeypatch, operator):
    """Invariant: a process the python backend starts (``bash -c "exec <stub> ..."``) under tritonserver's
    environment sees exactly the operator's LD_PRELOAD and BASH_ENV (absent when the operator set none), no
    FASTPATH_STUB_* variables, and the operator's BASH_ENV file was still read."""
    monkeypatch.setattr(malloc, "search_paths", lambda: [fake_library.parent])
    site = tmp_path / "site-bash-env"
    site.write_text("export SITE_BASH_ENV_READ=yes\n")
    given = {key: str(site) if value == "SITE" else value for key, value in operator.items()}
    base = {key: value for key, value in os.environ.items() if key not in ("LD_PRELOAD", "BASH_ENV")}
    env = malloc.malloc_environment(dict(base, **given), "tcmalloc", tmp_path)
    env["LD_PRELOAD"] = given.get("LD_PRELOAD", "")  # the fake library cannot be loaded: bash itself runs without it
    shown = subprocess.run(["bash", "-c", "exec env"], env=env, capture_output=True, text=True, check=True).stdout
    seen = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert seen.get("LD_PRELOAD") == given.get("LD_PRELOAD")
    assert seen.get("BASH_ENV") == given.get("BASH_ENV")
    assert not [key for key in seen if key.startswith("FASTPATH_STUB_")]
    assert seen.get("SITE_BASH_ENV_READ") == ("yes" if "BASH_ENV" in given else None)


def test_glibc_leaves_the_environment_alone(tmp_path, fake_library, monkeypatch):
    """Invariant: --malloc glibc changes nothing and writes nothing."""
    monkeypatch.setattr(malloc, "search_paths", lambda: [fake_library.parent])
    env = {"PATH": "/usr/bin", "LD_PRELOAD": "libm.so.6"}
    assert malloc.malloc_environment(dict(env), "glibc", tmp_path) == env
    assert not (tmp_path / malloc.STUB_ENV_FILE).exists()


def test_auto_without_tcmalloc_falls_back_to_glibc_with_a_warning_naming_make_setup(tmp_path, monkeypatch, caplog):
    """Invariant: auto with no library anywhere leaves the environment alone and warns, naming the fix."""
    monkeypatch.setattr(malloc, "search_paths", lambda: [tmp_path / "empty"])
    with caplog.at_level(logging.WARNING, logger="fastpath.server.malloc"):
        assert malloc.malloc_environment({"PATH": "/usr/bin"}, "auto", tmp_path) == {"PATH": "/usr/bin"}
    assert "make setup" in caplog.text and "libtcmalloc_minimal.so.4" in caplog.text


def test_tcmalloc_asked_for_but_missing_is_an_error_naming_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(malloc, "search_paths", lambda: [tmp_path / "empty"])
    with pytest.raises(ServerError, match=r"malloc tcmalloc: none of libtcmalloc_minimal\.so\.4.*empty.*make setup"):
        malloc.malloc_environment({}, "tcmalloc", tmp_path)


def test_fastpath_tcmalloc_naming_no_file_is_an_error(tmp_path):
    with pytest.raises(ServerError, match=r"FASTPATH_TCMALLOC=/nowhere/libtcmalloc\.so: no such file"):
        malloc.malloc_environment({"FASTPATH_TCMALLOC": "/nowhere/libtcmalloc.so"}, "auto", tmp_path)


def test_fastpath_tcmalloc_wins_over_the_search(tmp_path, fake_library, monkeypatch):
    """Invariant: an explicit FASTPATH_TCMALLOC is the library preloaded, whatever the search would find."""
    monkeypatch.setattr(malloc, "search_paths", lambda: [fake_library.parent])
    chosen = tmp_path / "libtcmalloc.so.4"
    chosen.write_bytes(b"\x7fELF")
    env = malloc.malloc_environment({"FASTPATH_TCMALLOC": str(chosen)}, "auto", tmp_path)
    assert env["LD_PRELOAD"] == str(chosen)


def test_fastpath_tcmalloc_naming_another_library_is_preloaded_with_a_warning(tmp_path, caplog):
    """Invariant: a FASTPATH_TCMALLOC whose file name does not say tcmalloc (libm.so.6) is still what gets preloaded,
    as the operator asked, and the log warns that it does not look like tcmalloc."""
    other = tmp_path / "libm.so.6"
    other.write_bytes(b"\x7fELF")
    with caplog.at_level(logging.WARNING, logger="fastpath.server.malloc"):
        env = malloc.malloc_environment({"FASTPATH_TCMALLOC": str(other)}, "auto", tmp_path)
    assert env["LD_PRELOAD"] == str(other)
    assert "does not look like tcmalloc" in caplog.text


def test_an_unknown_choice_is_an_error_naming_the_choices(tmp_path):
    with pytest.raises(ServerError, match=r"malloc 'jemalloc' \(--malloc, FASTPATH_MALLOC\) is not one of auto, tcmalloc, glibc"):
        malloc.malloc_environment({}, "jemalloc", tmp_path)


def test_the_search_looks_in_this_environment_first():
    """Invariant: make setup's copy (sys.prefix/lib/tcmalloc) is found before a system one."""
    import sys

    assert malloc.search_paths()[0] == Path(sys.prefix) / "lib" / "tcmalloc"
