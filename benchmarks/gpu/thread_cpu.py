"""CPU seconds and minor page faults per thread of a model's stub processes over a load cell: which threads
hold the cores, and which touch fresh memory (a minor fault per 4 KiB page first written after malloc got it
from the kernel: buffers that malloc hands back to the kernel on free and takes again on the next request).

Python threads are named from ``py-spy dump`` (its ``Thread <tid> (...): "<name>"`` lines); threads without Python
frames (OpenCV's pool, CUDA's and ONNX Runtime's own) keep their Linux name (``/proc/<pid>/task/<tid>/comm``), so
a native pool that busy-waits shows up as native cores that no Python stage accounts for.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

PY_SPY_THREAD = re.compile(r'^Thread (\d+) \([^)]*\): "([^"]*)"', re.MULTILINE)


def stat_usage(stat: Path) -> tuple[str, float, int]:
    """(name, CPU seconds user + system, minor faults) from a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat``
    file (proc(5): ``minflt`` is field 10, ``utime`` and ``stime`` 14 and 15).

    Raises:
        OSError, IndexError, ValueError: the process or thread is gone, or the file is not a stat file.
    """
    head, _, rest = stat.read_text().rpartition(")")
    fields = rest.split()
    return head.partition("(")[2], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def _threads(pid: int) -> dict[int, tuple[str, float, int]]:
    """tid -> (Linux thread name, CPU seconds so far, minor faults so far) of every thread of ``pid``; {} if it is gone."""
    found = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found[int(task.name)] = stat_usage(task / "stat")
        except (OSError, IndexError, ValueError):
            continue
    return found


def python_thread_names(py_spy: str | None, pid: int) -> dict[int, str]:
    """tid -> Python thread name of ``pid`` from one ``py-spy dump`` ({} without py-spy or on failure)."""
    if not py_spy:
        return {}
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): name for tid, name in PY_SPY_THREAD.findall(done.stdout)}


def group_name(name: str) -> str:
    """A thread pool's name without its worker number: ``text_detection-decode_3`` -> ``text_detection-decode``."""
    return re.sub(r"[_-]\d+$", "", name) or name


class ThreadCpu:
    """Per-thread CPU of ``pids`` between construction and :meth:`finish`."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.start = {pid: _threads(pid) for pid in pids}

    def finish(self, wall_s: float, py_spy: str | None = None, top: int = 12) -> dict:
        """Cores (CPU seconds / ``wall_s``) and minor faults per thread group, and the ``top`` threads, Python names
        where py-spy gives them.

        Returns:
            ``{"groups": {name: cores}, "faults": {name: minor faults}, "top": [{"pid", "tid", "name", "cores"}]}``,
            largest first; a group is ``py:<pool>`` for Python threads, ``native:<Linux name>`` for the others.
        """
        groups: dict[str, float] = {}
        faults: dict[str, int] = {}
        rows = []
        for pid in self.pids:
            names = python_thread_names(py_spy, pid)
            before = self.start.get(pid, {})
            for tid, (comm, cpu_s, minflt) in _threads(pid).items():
                _, cpu_before, minflt_before = before.get(tid, (comm, 0.0, 0))
                used = cpu_s - cpu_before
                python = names.get(tid)
                key = f"py:{group_name(python)}" if python else f"native:{group_name(comm)}"
                groups[key] = groups.get(key, 0.0) + used
                faults[key] = faults.get(key, 0) + minflt - minflt_before
                rows.append({"pid": pid, "tid": tid, "name": python or f"({comm})", "cores": used / wall_s})
        rows.sort(key=lambda row: -row["cores"])
        return {"groups": {k: round(v / wall_s, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v > 0.005 * wall_s},
                "faults": {k: v for k, v in sorted(faults.items(), key=lambda kv: -kv[1]) if v > 0},
                "top": [{**row, "cores": round(row["cores"], 2)} for row in rows[:top]]}
