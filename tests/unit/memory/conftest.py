"""Fixtures for the memory tests: small pools over page-aligned (mmap) memory, a fake clock."""

from __future__ import annotations

import threading

import pytest

from fastpath.memory import BlockPool, PageAlignedAllocator, PoolConfig

KIB = 1024


class FakeClock:
    """Monotonic seconds that move only when told to."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class ClockCondition(threading.Condition):
    """A condition whose ``wait(timeout)`` advances a fake clock instead of sleeping.

    Records each timeout it was asked to wait, so tests check the wait bound without time passing.
    """

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.waited_s: list[float] = []

    def wait(self, timeout=None):  # noqa: D102 - threading.Condition API
        self.waited_s.append(timeout)
        self.clock.now_s += timeout
        return False


class SignallingCondition(threading.Condition):
    """A real condition that sets ``entered`` when a thread starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()

    def wait(self, timeout=None):  # noqa: D102 - threading.Condition API
        self.entered.set()
        return super().wait(timeout)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_pool(clock):
    """Build a pool over page-aligned memory; every pool made is closed at the end of the test."""
    pools = []

    def make(condition=None, allocator=None, **config) -> BlockPool:
        config.setdefault("capacity_bytes", 64 * KIB)
        config.setdefault("max_block_bytes", 16 * KIB)
        pool = BlockPool(allocator or PageAlignedAllocator(), PoolConfig(**config), clock=clock, condition=condition)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()
