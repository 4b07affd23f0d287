"""Whether a process still runs: the check shared by the cleanups of state directories, build staging directories
and the control plane's instance records (a record, a directory or a lock left by a process that is gone)."""

from __future__ import annotations

import os
from pathlib import Path


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and has not exited.

    Another user's process exists (``kill`` answers EPERM). A zombie has exited: a killed stub stays one until
    tritonserver, its parent, reaps it, which Triton 2.51 did not do for tens of seconds, while ``kill(pid, 0)``
    still succeeds on it. Without /proc (not Linux) the ``kill`` is the whole check.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # the state is the field after the parenthesized command name, which may itself hold spaces
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc on this system, or it exited just now
        return not Path("/proc").is_dir()
