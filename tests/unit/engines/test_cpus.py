"""CPU counts for ONNX Runtime's thread pools (fastpath.engines.cpus)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fastpath.engines import cpus

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "model_repository", "text_embedding", "1", "model.onnx")


def test_zero_threads_follow_the_cpus_the_process_may_use(monkeypatch):
    """Explicit counts are kept; 0 stays ONNX Runtime's default on a whole machine and becomes the process's
    CPUs when an affinity mask or CPU quota leaves it fewer (2 of a 16-CPU host: 2, not 16)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cpus, "cpu_count", lambda only_physical_cores=False: 2)
    assert cpus.process_cpus() == 2
    assert cpus.ort_intra_op_threads(0) == 2
    assert cpus.ort_intra_op_threads(3) == 3
    monkeypatch.setattr(cpus, "cpu_count", lambda only_physical_cores=False: 16)
    assert cpus.ort_intra_op_threads(0) == 0
    with pytest.raises(ValueError, match="intra_op_threads must be >= 0, got -1"):
        cpus.ort_intra_op_threads(-1)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs Linux affinity and 2+ CPUs")
@pytest.mark.skipif(not os.path.exists(MODEL), reason="needs the built model_repository/text_embedding/1/model.onnx")
def test_a_session_pinned_to_one_cpu_starts_no_worker_threads():
    """Real ONNX Runtime in a process pinned to one CPU: FastPath's engine with intra_op_threads=0 starts
    no intra-op worker (one thread: the caller), where ONNX Runtime's own default would start one per
    physical core of the host (measured: 1 extra on the 2-core dev machine, 15 on a 16-core host)."""
    script = textwrap.dedent(f"""
        import os
        os.sched_setaffinity(0, {{sorted(os.sched_getaffinity(0))[0]}})
        from fastpath.engines.cpus import ort_intra_op_threads, process_cpus
        from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
        before = len(os.listdir("/proc/self/task"))
        engine = OnnxRuntimeEngine({MODEL!r}, intra_op_threads=0)
        print(process_cpus(), ort_intra_op_threads(0), len(os.listdir("/proc/self/task")) - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["1", "1", "0"]


def test_a_bad_loky_max_cpu_count_names_the_variable(monkeypatch):
    """The real joblib reads LOKY_MAX_CPU_COUNT; a value that is not a number fails naming it (at model load)."""
    from fastpath.errors import ConfigError

    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "abc")
    with pytest.raises(ConfigError, match="LOKY_MAX_CPU_COUNT = 'abc': expected a whole number of CPUs"):
        cpus.ort_intra_op_threads(0)
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "1")
    assert cpus.process_cpus() == 1


def test_more_threads_than_cpus_is_kept_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(cpus, "cpu_count", lambda only_physical_cores=False: 2)
    cpus._warn_oversubscribed.cache_clear()
    with caplog.at_level("WARNING", logger="fastpath.engines.cpus"):
        assert cpus.ort_intra_op_threads(64) == 64
        assert cpus.ort_intra_op_threads(64) == 64
        assert cpus.ort_intra_op_threads(2) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "intra_op_threads=64 is more than the 2 CPU(s) this process may use (affinity mask, CPU quota): "
        "its threads will take turns on them; 0 sizes the pool to the CPUs"]
