"""A thread pool whose next task goes to the worker that went idle last (LIFO), not to the one idle longest.

``concurrent.futures.ThreadPoolExecutor`` hands a task to whichever worker the queue wakes, and its idle workers
wait on one queue: under light load each task meets the worker that has waited longest. At one request at a time
text_detection's eight decode threads then take the images in turn, each after idling for the last seven (seen in
its GPU timeline at c=1: every image on a different decode thread). :class:`LifoThreadPool` keeps the idle workers
on a stack, as folly's ``LifoSem`` does for its thread pools: under light load one worker does the work, on a core
and with caches that last did it, and the others stay asleep; under full load every worker is busy either way.
Tasks that find no idle worker start a new one (up to ``workers``) or wait in arrival order.

Its ``submit`` and ``shutdown`` behave as ``ThreadPoolExecutor``'s, the subset FastPath uses.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

ORDERS = ("fifo", "lifo")  # fifo: concurrent.futures.ThreadPoolExecutor; lifo: LifoThreadPool

_Task = tuple[Future, Callable[..., Any], tuple, dict]


class _Worker:
    def __init__(self) -> None:
        self.wake = threading.Event()
        self.task: _Task | None = None


class LifoThreadPool:
    """At most ``workers`` threads, started as tasks need them; an idle one is woken last-idle first.

    Args:
        workers: the most threads, >= 1.
        thread_name_prefix: the threads are named ``<prefix>_<n>``.

    Raises:
        ValueError: ``workers`` < 1.
    """

    def __init__(self, workers: int, thread_name_prefix: str = "fastpath-worker") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.max_workers, self.thread_name_prefix = workers, thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # a stack: the last to go idle is woken first
        self._backlog: collections.deque[_Task] = collections.deque()
        self._threads: list[threading.Thread] = []
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker; its result or exception lands in the returned future.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        future: Future = Future()
        task = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                worker = self._idle.pop()
                worker.task = task
                worker.wake.set()
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._work, args=(task,), daemon=True,
                                          name=f"{self.thread_name_prefix}_{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
            else:
                self._backlog.append(task)
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Take no more tasks; the queued ones still run. ``wait``: return once every worker has ended."""
        with self._lock:
            self._shutdown = True
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for worker in idle:
            worker.wake.set()  # with no task: it ends
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self, task: _Task | None) -> None:
        me = _Worker()
        while True:
            if task is not None:
                _run(task)
            with self._lock:
                if self._backlog:
                    task = self._backlog.popleft()
                    continue
                if self._shutdown:
                    return
                me.wake.clear()
                self._idle.append(me)
            me.wake.wait()
            with self._lock:
                task, me.task = me.task, None
            if task is None:  # woken by shutdown
                return


def _run(task: _Task) -> None:
    future, fn, args, kwargs = task
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # the future carries it, as concurrent.futures does
        future.set_exception(exc)
    else:
        future.set_result(result)


def thread_pool(order: str, workers: int, thread_name_prefix: str) -> Any:
    """A pool of ``workers`` threads whose idle workers take tasks in ``order`` (one of :data:`ORDERS`).

    Raises:
        ValueError: an unknown ``order``, or ``workers`` < 1.
    """
    if order == "lifo":
        return LifoThreadPool(workers, thread_name_prefix)
    if order == "fifo":
        return ThreadPoolExecutor(workers, thread_name_prefix=thread_name_prefix)
    raise ValueError(f"thread pool order {order!r} is not one of {', '.join(ORDERS)}")
