"""fastpath.workers: a thread pool that wakes the worker idle last, with ThreadPoolExecutor's submit/shutdown."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from fastpath.errors import ConfigError
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.workers import LifoThreadPool, thread_pool


def _start_workers(pool: LifoThreadPool, count: int) -> None:
    """Start ``count`` workers at once: each task waits until all of them run, so none is reused."""
    barrier = threading.Barrier(count + 1)
    futures = [pool.submit(barrier.wait, 10) for _ in range(count)]
    barrier.wait(10)
    for future in futures:
        future.result(timeout=10)


def _wait_idle(pool: LifoThreadPool, count: int) -> None:
    for _ in range(1000):
        with pool._lock:
            if len(pool._idle) == count:
                return
        time.sleep(0.005)
    raise AssertionError(f"{count} workers never went idle")


def test_a_task_goes_to_the_worker_idle_last_and_sequential_tasks_stay_on_it():
    """Invariant: with several workers idle, the next task runs on the one that went idle last, and tasks submitted
    one at a time (each after the last finished) all run on that one worker."""
    pool = LifoThreadPool(4, "test-lifo")
    try:
        _start_workers(pool, 4)
        _wait_idle(pool, 4)
        with pool._lock:
            last_idle = pool._idle[-1]
        names = set()
        for _ in range(12):
            names.add(pool.submit(lambda: threading.current_thread().name).result(timeout=10))
            _wait_idle(pool, 4)
        assert len(names) == 1
        with pool._lock:
            assert pool._idle[-1] is last_idle  # the same worker each time, back on top of the stack
    finally:
        pool.shutdown(wait=True)


def test_results_exceptions_backlog_and_shutdown_behave_as_thread_pool_executor():
    """Invariant: every submitted task runs exactly once and its future carries its result or its exception;
    tasks beyond the workers wait and run in arrival order (one worker here, so the order is observable);
    shutdown(wait=True) runs the queued tasks first, ends every thread, and a later submit raises RuntimeError."""
    pool = LifoThreadPool(1, "test-lifo")
    gate = threading.Event()
    ran: list[int] = []
    lock = threading.Lock()

    def task(value: int) -> int:
        gate.wait(10)
        with lock:
            ran.append(value)
        return value * 10

    def fail() -> None:
        raise KeyError("bad image")

    futures = [pool.submit(task, value) for value in range(6)]
    failing = pool.submit(fail)
    assert len(pool._threads) == 1 and len(pool._backlog) == 6
    gate.set()
    assert [future.result(timeout=10) for future in futures] == [0, 10, 20, 30, 40, 50]
    with pytest.raises(KeyError, match="bad image"):
        failing.result(timeout=10)
    assert ran == [0, 1, 2, 3, 4, 5]  # the backlog in arrival order
    queued = [pool.submit(task, value) for value in (7, 8, 9)]
    pool.shutdown(wait=True)
    assert [future.result(timeout=0) for future in queued] == [70, 80, 90]
    assert not any(thread.is_alive() for thread in pool._threads)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(task, 1)


def test_the_order_is_a_checked_configuration_choice():
    """Invariant: thread_pool gives ThreadPoolExecutor for fifo and LifoThreadPool for lifo; text_detection's
    thread_pool_order takes only those two and names the parameter and the choices otherwise."""
    fifo, lifo = thread_pool("fifo", 2, "t"), thread_pool("lifo", 2, "t")
    try:
        assert isinstance(fifo, ThreadPoolExecutor) and isinstance(lifo, LifoThreadPool)
    finally:
        fifo.shutdown()
        lifo.shutdown()
    assert TextDetectionConfig(thread_pool_order="lifo").thread_pool_order == "lifo"
    with pytest.raises(ConfigError, match="thread_pool_order.*one of fifo, lifo"):
        TextDetectionConfig(thread_pool_order="random")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        LifoThreadPool(0)
