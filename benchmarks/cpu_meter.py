"""How busy the machine was, and with whose work, during one benchmark measurement (psutil).

The dev machine has 2 cores and is shared: another process's CPU time during a served cell slows
the served path (client, tritonserver, stub threads) more than the one-process raw engine. Each
cell records, per second of wall time:

    ours_cores     CPU seconds of this process and all its descendants (tritonserver, its stubs, and the
                   perf_analyzer runs that loaded them, which have exited and been waited for by then)
    other_cores    every other process's CPU seconds (system-wide busy time minus ours; includes
                   kernel threads and interrupts)
    steal_cores    time the hypervisor ran another guest instead of this machine's CPUs

so a round whose ratios moved can be told apart from one where the machine was quiet. Busy time
is psutil.cpu_times() user + nice + system + irq + softirq + steal (Linux /proc/stat fields).
"""

from __future__ import annotations

import time

import psutil


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of ``process`` so far; 0 once it has exited."""
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system


def waited_children_seconds() -> float:
    """User + system CPU seconds of this process's children that exited and were waited for (perf_analyzer runs)."""
    times = psutil.Process().cpu_times()
    return times.children_user + times.children_system


def _busy(times) -> float:
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))


class CpuMeter:
    """Samples system-wide and own-tree CPU seconds; :meth:`since` gives the cores used between samples."""

    def __init__(self) -> None:
        self.root = psutil.Process()

    def _ours(self) -> float:
        # a process that exited since the listing counts 0: its time is lost to "other"
        return waited_children_seconds() + sum(cpu_seconds(p) for p in [self.root, *self.root.children(recursive=True)])

    def sample(self) -> tuple[float, float, float, float]:
        """(wall s, system busy CPU s, our tree's CPU s, steal s) now."""
        times = psutil.cpu_times()
        return time.perf_counter(), _busy(times), self._ours(), getattr(times, "steal", 0.0)

    def since(self, start: tuple[float, float, float, float]) -> dict[str, float]:
        """Cores used since ``start`` (a :meth:`sample`): {"ours_cores", "other_cores", "steal_cores"}."""
        wall, busy, ours, steal = (now - then for now, then in zip(self.sample(), start))
        if wall <= 0:
            return {"ours_cores": 0.0, "other_cores": 0.0, "steal_cores": 0.0}
        return {"ours_cores": round(ours / wall, 3), "other_cores": round(max(busy - ours, 0.0) / wall, 3),
                "steal_cores": round(steal / wall, 3)}
