"""How many CPUs this process may use, and how many intra-op threads an ONNX Runtime CPU session gets.

ONNX Runtime sizes a session's default thread pool (``intra_op_num_threads = 0``) from the host's physical
cores and pins one worker to each; it looks at neither the process's affinity mask (taskset, numactl, a
container's cpuset) nor its cgroup CPU quota (``docker --cpus``, Kubernetes CPU limits):
microsoft/onnxruntime#29510. So 0 means one thread per CPU the process may use: the deployment's CPU allotment
is respected, as a Triton user pinning instances or setting CPU limits expects. On a machine the process may
use whole, ONNX Runtime's own default is kept unchanged. What the default did under a mask and under a quota:
docs/deployment.md#cpu-threads-when-the-server-may-use-only-some-of-the-machines-cpus.
"""

from __future__ import annotations

import functools
import logging
import os

from joblib import cpu_count

from fastpath.errors import ConfigError

LOG = logging.getLogger(__name__)


def process_cpus() -> int:
    """CPUs this process may run on: the smallest of the machine's CPUs, the affinity mask and the
    cgroup CPU quota (rounded up: a 1.5-CPU quota counts 2), and ``LOKY_MAX_CPU_COUNT`` when set; at
    least 1.

    Computed by ``joblib.cpu_count(only_physical_cores=False)`` (loky), which reads all four.

    Raises:
        ConfigError: ``LOKY_MAX_CPU_COUNT`` is set but not a whole number.
    """
    try:
        return max(1, int(cpu_count(only_physical_cores=False)))
    except ValueError as exc:
        value = os.environ.get("LOKY_MAX_CPU_COUNT")
        if value is None:
            raise
        raise ConfigError(f"environment variable LOKY_MAX_CPU_COUNT = {value!r}: expected a whole number of CPUs "
                          "(it caps the CPUs FastPath's ONNX Runtime sessions use)") from exc


@functools.cache
def _warn_oversubscribed(requested: int, cpus: int) -> None:
    LOG.warning("intra_op_threads=%d is more than the %d CPU(s) this process may use (affinity mask, CPU quota): "
                "its threads will take turns on them; 0 sizes the pool to the CPUs", requested, cpus)


def ort_intra_op_threads(requested: int) -> int:
    """``intra_op_num_threads`` for an ONNX Runtime CPU session asked for ``requested`` threads.

    ``requested`` > 0 is kept (with a warning in the log, once per value, when it is more than
    :func:`process_cpus`). 0 stays 0 (ONNX Runtime's default: one pinned thread per physical core)
    when the process may use every CPU of the machine, and becomes :func:`process_cpus` when it
    may not, so the pool never outnumbers the CPUs the process has.

    Raises:
        ValueError: ``requested`` < 0.
        ConfigError: see :func:`process_cpus`.
    """
    if requested < 0:
        raise ValueError(f"intra_op_threads must be >= 0, got {requested}")
    cpus = process_cpus()
    if requested:
        if requested > cpus:
            _warn_oversubscribed(requested, cpus)
        return requested
    return cpus if cpus < (os.cpu_count() or cpus) else 0
