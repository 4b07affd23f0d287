"""Which malloc tritonserver runs with: tcmalloc, preloaded, where one is installed; glibc's otherwise.

Triton's model management guide notes that memory can grow over model load/unload cycles because glibc's malloc
keeps freed memory, and suggests tcmalloc or jemalloc through ``LD_PRELOAD``. Measured on an H100 under
perf_analyzer load (docs/benchmarks/reload_memory_h100.md): tritonserver's RSS grew 27 MiB per reload of
text_embedding with glibc, and about 1 MiB with tcmalloc or jemalloc. FastPath reloads a model after a stub
dies, so a long-lived server would otherwise grow with every recovery. tcmalloc is the one Triton's own
container ships. tcmalloc runs with ``TCMALLOC_AGGRESSIVE_DECOMMIT=true`` (:data:`TCMALLOC_SETTINGS`; the
operator's own value wins): by default it kept the first reload's ~25 MiB of freed pages, a step that broke the
GPU soak's 5% bound on RSS; decommitting free spans at once left RSS 8 MiB over its start after six reloads.

Only tritonserver gets it. Its python-backend stubs keep glibc: text_detection's stub returns memory with
glibc's ``malloc_trim`` and its huge-page tunable (docs/design/text_detection.md, "Memory"). The python backend
starts each stub through ``bash -c "exec <stub> ..."`` (python_backend ``src/stub_launcher.cc``), and a
non-interactive bash first reads the file ``BASH_ENV`` names: :func:`write_stub_env` writes one that gives the
stub the operator's own ``LD_PRELOAD`` and ``BASH_ENV`` back.
"""

from __future__ import annotations

import logging
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

from fastpath.errors import ServerError

LOG = logging.getLogger("fastpath.server.malloc")

CHOICES = ("auto", "tcmalloc", "glibc")  # auto: tcmalloc where one is found, else glibc (with a warning)
LIBRARY_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")  # Debian's libtcmalloc-minimal4; Triton's image
VENV_DIR = Path("lib") / "tcmalloc"  # under sys.prefix: where scripts/install_tcmalloc.sh (make setup) puts it
STUB_ENV_FILE = "stub_env.sh"
# gperftools' own variables for tritonserver's tcmalloc, unless the environment sets them: return free spans to
# the system at once (off by default since gperftools 2.6), so RSS follows what is live after a reload.
TCMALLOC_SETTINGS = {"TCMALLOC_AGGRESSIVE_DECOMMIT": "true"}
# The stub's environment as the operator gave it: set by :func:`malloc_environment`, read by the BASH_ENV file.
STUB_LD_PRELOAD, STUB_BASH_ENV = "FASTPATH_STUB_LD_PRELOAD", "FASTPATH_STUB_BASH_ENV"
STUB_ENV_SCRIPT = f"""\
# Written by fastpath serve. tritonserver runs with tcmalloc preloaded; the python backend starts each stub
# through `bash -c`, which reads this file first: the stub gets the operator's LD_PRELOAD and BASH_ENV back.
if [ -n "${{{STUB_LD_PRELOAD}-}}" ]; then export LD_PRELOAD="${STUB_LD_PRELOAD}"; else unset LD_PRELOAD; fi
if [ -n "${{{STUB_BASH_ENV}-}}" ]; then export BASH_ENV="${STUB_BASH_ENV}"; else unset BASH_ENV; fi
unset {STUB_LD_PRELOAD} {STUB_BASH_ENV}
if [ -n "${{BASH_ENV-}}" ]; then . "$BASH_ENV"; fi
"""


def search_paths() -> list[Path]:
    """Where :func:`find_tcmalloc` looks, in order: this environment's ``lib/tcmalloc/``, then the system's
    library folders (Debian's multiarch one first)."""
    system = [Path(f"/usr/lib/{platform.machine()}-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/lib")]
    return [Path(sys.prefix) / VENV_DIR, *system]


def find_tcmalloc(env: Mapping[str, str]) -> Path | None:
    """The tcmalloc shared library to preload: ``FASTPATH_TCMALLOC`` of ``env`` when set, else the first of
    :data:`LIBRARY_NAMES` in :func:`search_paths`; None when there is none.

    Raises:
        ServerError: ``FASTPATH_TCMALLOC`` names no file.
    """
    explicit = env.get("FASTPATH_TCMALLOC")
    if explicit:
        if not Path(explicit).is_file():
            raise ServerError(f"FASTPATH_TCMALLOC={explicit}: no such file; name the tcmalloc shared library "
                              f"(e.g. {LIBRARY_NAMES[0]}) or unset it")
        if "tcmalloc" not in Path(explicit).name:  # preloaded as given: a library without malloc leaves glibc's
            LOG.warning("FASTPATH_TCMALLOC=%s does not look like tcmalloc (e.g. %s); preloading it as given",
                        explicit, LIBRARY_NAMES[0])
        return Path(explicit)
    for folder in search_paths():
        for name in LIBRARY_NAMES:
            if (folder / name).is_file():
                return folder / name
    return None


def malloc_environment(env: dict[str, str], choice: str, state_dir: Path) -> dict[str, str]:
    """``env`` for tritonserver with ``choice``'s malloc; logs what was chosen (a warning when ``auto`` found
    no tcmalloc).

    For tcmalloc: ``LD_PRELOAD`` gets the library first (the operator's own preloads follow), ``BASH_ENV``
    names the file :func:`write_stub_env` writes into ``state_dir``, which gives each stub the operator's values,
    and :data:`TCMALLOC_SETTINGS` fill in what ``env`` leaves unset.

    Raises:
        ServerError: ``choice`` is not one of :data:`CHOICES`; ``tcmalloc`` was asked for and none is installed;
            ``FASTPATH_TCMALLOC`` names no file.
    """
    if choice not in CHOICES:
        raise ServerError(f"malloc {choice!r} (--malloc, FASTPATH_MALLOC) is not one of {', '.join(CHOICES)}")
    if choice == "glibc":
        LOG.info("malloc: glibc for tritonserver (asked for)")
        return env
    library = find_tcmalloc(env)
    if library is None:
        where = ", ".join(str(p) for p in search_paths())
        if choice == "tcmalloc":
            raise ServerError(f"malloc tcmalloc: none of {', '.join(LIBRARY_NAMES)} in {where}; run make setup "
                              "(scripts/install_tcmalloc.sh), install Debian's libtcmalloc-minimal4, or set FASTPATH_TCMALLOC")
        LOG.warning("malloc: glibc for tritonserver, no tcmalloc found (%s in %s): its memory grows with each model "
                    "reload; run make setup (scripts/install_tcmalloc.sh) to install one", ", ".join(LIBRARY_NAMES), where)
        return env
    env = dict(env)
    env[STUB_LD_PRELOAD], env[STUB_BASH_ENV] = env.get("LD_PRELOAD", ""), env.get("BASH_ENV", "")
    env["LD_PRELOAD"] = ":".join(p for p in (str(library), env[STUB_LD_PRELOAD]) if p)
    env["BASH_ENV"] = str(write_stub_env(state_dir))
    for name, value in TCMALLOC_SETTINGS.items():
        env.setdefault(name, value)
    LOG.info("malloc: tcmalloc for tritonserver (%s); its python-backend stubs keep glibc's", library)
    return env


def write_stub_env(state_dir: Path) -> Path:
    """Write :data:`STUB_ENV_SCRIPT` as ``state_dir/stub_env.sh``; return its path."""
    path = state_dir / STUB_ENV_FILE
    path.write_text(STUB_ENV_SCRIPT)
    return path
