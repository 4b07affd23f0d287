"""CPU per thread of a process (benchmarks/gpu/thread_cpu.py), as the served GPU benchmarks report it per stub.

Invariants: a thread that burns CPU through the measured window shows up, with its cores, under its Linux name
when py-spy gives no Python name; pool workers group under their pool's name (the worker number dropped, a name
that merely ends in a digit kept).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

from thread_cpu import PY_SPY_THREAD, ThreadCpu, group_name  # noqa: E402


def test_a_busy_thread_is_found_with_its_cores_under_its_linux_name():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    worker = threading.Thread(target=spin, daemon=True)
    worker.start()
    try:
        time.sleep(0.05)
        meter = ThreadCpu([os.getpid()])
        started = time.monotonic()
        time.sleep(0.6)
        result = meter.finish(time.monotonic() - started)
    finally:
        stop.set()
        worker.join()
    busy = next(row for row in result["top"] if row["tid"] == worker.native_id)
    assert busy["cores"] > 0.1 and busy["name"].startswith("(")  # no py-spy here: the Linux name, in parentheses
    assert sum(v for k, v in result["groups"].items() if k.startswith("native:")) >= busy["cores"] - 0.01


def test_pool_workers_group_under_their_pools_name():
    assert group_name("text_detection-decode_3") == "text_detection-decode"
    assert group_name("onnxruntime-cuda_0") == "onnxruntime-cuda"
    assert group_name("text_detection_0_0-metrics") == "text_detection_0_0-metrics"
    assert group_name("python3") == "python3"


def test_py_spy_dump_lines_give_thread_ids_and_names():
    dump = 'Process 921: triton_python_backend_stub\nThread 921 (idle): "MainThread"\n    wait (threading.py:359)\n' \
           'Thread 1125 (active): "onnxruntime-cuda_0"\n'
    assert dict((int(t), n) for t, n in PY_SPY_THREAD.findall(dump)) == {921: "MainThread", 1125: "onnxruntime-cuda_0"}


def test_a_thread_that_writes_fresh_pages_shows_its_minor_faults():
    """Invariant: pages a live thread first writes in the window count as minor faults under its group."""
    import mmap

    go, touched, release = threading.Event(), threading.Event(), threading.Event()

    def touch() -> None:
        go.wait()
        region = mmap.mmap(-1, 256 * 4096)  # anonymous, never touched before
        for page in range(256):
            region[page * 4096] = 1
        touched.set()
        release.wait(5)  # a thread that has exited is gone from /proc, with its counts
        region.close()

    worker = threading.Thread(target=touch, daemon=True)
    worker.start()
    try:
        meter = ThreadCpu([os.getpid()])
        go.set()
        assert touched.wait(5)
        result = meter.finish(0.1)
    finally:
        release.set()
        worker.join()
    assert sum(result["faults"].values()) >= 256
