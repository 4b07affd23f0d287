"""The stub exits when tritonserver is gone.

Triton 2.51's python-backend stub outlives its server when the server dies without stopping it: a
crash (a >4 MB JSON body, upstream triton-inference-server/server#5840) or a SIGKILL (`fastpath
serve` killed, its tritonserver following through PR_SET_PDEATHSIG). Left alone, such stubs, with
parent PID 1, run on for hours holding ~250 MB and a /dev/shm region each, ignoring SIGTERM.
Such a stub is stuck: a thread blocked in a ``pb_utils`` call (a metric update, a response send)
waits forever for the dead server's reply while holding the GIL, so no Python thread of the stub can
act (seen with py-spy: the metrics flusher in ``Metric.set``, every other thread parked).

So the watchdog is a separate process, a POSIX ``sh`` loop started from the stub: once a second it
reads the stub's ``/proc/<pid>/stat`` (with the shell's own ``read``, not ``cut``: the only process it
starts per second is ``sleep``); when the stub's parent is no longer the tritonserver that
started it, it sends SIGKILL to the stub, but only if the process is still the same stub (same start
time, so a reused PID is never touched). When the stub exits, normally or killed (a zombie its server
never reaps), the loop ends by itself.
(``PR_SET_PDEATHSIG`` in the stub would fire when the *thread* of tritonserver that spawned it ends,
not when the process does.)
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from pathlib import Path

LOG = logging.getLogger(__name__)
_started = threading.Event()

# $1 stub pid, $2 tritonserver pid, $3 the stub's start time (field 22 of /proc/<pid>/stat).
# fields(): the parent pid (field 4) and start time (field 22) of process $1, empty once it is gone or a zombie
# (state Z: killed, and never reaped by a tritonserver that no longer waits for it);
# the fields after "pid (comm) " are split, so a comm holding spaces or parentheses cannot shift them.
WATCH_SCRIPT = r"""
set -f
fields() { ppid=; start=; IFS= read -r line 2>/dev/null < "/proc/$1/stat" || return 0; set -- ${line##*) }; ppid=$2; start=${20}
  case $1 in Z|X) ppid=; start=;; esac; }
fields "$1"
while [ "$ppid" = "$2" ]; do sleep 1; fields "$1"; done
if [ "$start" = "$3" ]; then kill -9 "$1"; fi
"""


def exit_with_server() -> subprocess.Popen | None:
    """Start the watchdog process for this stub (once per process; later calls return None)."""
    if _started.is_set():
        return None
    _started.set()
    pid, parent = os.getpid(), os.getppid()
    try:
        start_time = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]  # field 22 overall
        return subprocess.Popen(["/bin/sh", "-c", WATCH_SCRIPT, "fastpath-stub-watchdog", str(pid), str(parent), start_time],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=True, start_new_session=True)
    except OSError as exc:  # no /proc or no /bin/sh: serve without it
        LOG.warning("stub watchdog not started (%s): this stub will outlive a crashed tritonserver", exc)
        return None
