"""The maintained tools in scripts/ run end to end against a real tritonserver and print their tables."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _run(*argv: str, timeout_s: float = 240) -> str:
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_phase_profile_reports_every_request_in_execute_total():
    """phase_profile.py at c=1: throughput > 0, and execute.total counts one call per request served (> 0)."""
    out = _run("scripts/phase_profile.py", "--model", "text_embedding", "--concurrency", "1", "--seconds", "1")
    rate = float(re.search(r"at concurrency 1: ([\d.]+) texts/s", out).group(1))
    calls = int(re.search(r"execute\.total\s+[\d.]+\s+(\d+)", out).group(1))
    assert rate > 0 and calls > 0, out


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf (Debian package linux-perf) is not installed")
def test_serving_profile_attributes_samples_to_processes():
    """serving_profile.py: perf samples split by process; the shares of the top rows are percentages in (0, 100]."""
    out = _run("scripts/serving_profile.py", "--model", "text_embedding", "--concurrency", "2", "--seconds", "1", "--top", "5")
    shares = [float(share) for share in re.findall(r"^\s+([\d.]+)%", out, re.M)]
    assert shares and all(0 < share <= 100 for share in shares), out


def test_gpu_scripts_are_valid_bash():
    """gpu_setup.sh, gpu_env.sh and benchmarks/gpu/{served,detection,soak}_gpu.sh parse (bash -n): they run only on the GPU machine;
    gpu_bundle.sh too (it downloads wheels, so it is not run here)."""
    for script in (ROOT / "scripts" / "gpu_setup.sh", ROOT / "scripts" / "gpu_env.sh", ROOT / "scripts" / "gpu_bundle.sh",
                   ROOT / "benchmarks" / "gpu" / "served_gpu.sh",
                   ROOT / "benchmarks" / "gpu" / "detection_gpu.sh", ROOT / "benchmarks" / "gpu" / "soak_gpu.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
