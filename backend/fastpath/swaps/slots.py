"""Two engine slots per model instance: the active one serves, the standby one takes the next version.

A swap loads the new version into the standby slot, warms it up and passes it through a validation
gate while the active slot keeps serving; then one reference assignment under a lock flips the slots.
Batches already dispatched hold a lease on the slot they started with and finish there; the old
slot's engine is released when its last lease ends (reference counts). A failure at any stage closes
the standby and leaves the active slot serving; the reason is kept as ``last_error``. Overlapping
swaps are refused (:class:`SwapInProgressError`), never queued behind each other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from fastpath.errors import SwapError, SwapInProgressError

E = TypeVar("E")  # the engine-like object a slot holds; it must have close()


@dataclasses.dataclass
class _Slot(Generic[E]):
    version: int
    engine: E
    leases: int = 0
    retired: bool = False

    on_release: Callable[[], None] | None = None

    def maybe_close(self) -> bool:
        if self.retired and self.leases == 0 and self.engine is not None:
            self.engine.close()  # type: ignore[attr-defined]
            self.engine = None  # type: ignore[assignment]
            if self.on_release is not None:
                self.on_release()
            return True
        return False


@dataclasses.dataclass(frozen=True)
class SlotStatus:
    """What :meth:`EngineSlots.status` reports.

    Attributes:
        active_version: the version serving now.
        standby_version: the version being loaded (None when idle).
        state: ``serving`` | ``loading`` | ``validating`` | ``recording`` | ``flipping``.
        last_error: the reason the last swap failed, or None.
        swaps: swaps completed since start.
        draining: retired slots still finishing dispatched batches.
        last_swap_s: seconds the last completed swap took, from call to flip.
        previous_version: the version served before the last flip (what rollback returns to).
    """

    active_version: int
    standby_version: int | None
    state: str
    last_error: str | None
    swaps: int
    draining: int
    last_swap_s: float | None
    previous_version: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EngineSlots(Generic[E]):
    """The active/standby pair for one model instance.

    Args:
        version: the version the initial engine serves.
        engine: the initial (already validated) engine; any object with ``close()``.
        clock: monotonic clock in seconds (injected for tests).
        on_release: called after a retired engine is closed (e.g. to return heap pages to the OS).
        previous_version: the version served before ``version`` (from the serving-version record
            after a reload or restart), what a rollback returns to; None when there is none.
    """

    def __init__(self, version: int, engine: E, *, clock: Callable[[], float] = time.monotonic,
                 on_release: Callable[[], None] | None = None, previous_version: int | None = None) -> None:
        self._on_release = on_release
        self._lock = threading.Lock()
        self._swap_lock = threading.Lock()
        self._active: _Slot[E] = _Slot(version, engine, on_release=on_release)
        self.previous_version = previous_version
        self._retired: list[_Slot[E]] = []
        self._clock = clock
        self._state = "serving"
        self._standby_version: int | None = None
        self._last_error: str | None = None
        self._swaps = 0
        self._last_swap_s: float | None = None

    @property
    def active_version(self) -> int:
        return self._active.version

    @contextlib.contextmanager
    def lease(self) -> Iterator[tuple[E, int]]:
        """Hold the active slot for one batch: yields (engine, version); the slot is not released meanwhile."""
        with self._lock:
            slot = self._active
            slot.leases += 1
        try:
            yield slot.engine, slot.version
        finally:
            with self._lock:
                slot.leases -= 1
                if slot.maybe_close():
                    self._retired.remove(slot)

    def swap(self, version: int, load: Callable[[int], E], validate: Callable[[E, int], None],
             commit: Callable[[int, int], None] | None = None) -> float:
        """Load ``version`` into the standby slot, validate it, flip. Returns the seconds it took.

        Args:
            version: the version to serve next.
            load: builds the engine of a version (may raise); runs while the active slot serves.
            validate: raises if the loaded engine fails the gate (golden outputs, shapes, dtypes).
            commit: ``commit(version, active_version)`` runs after validation and right before the
                flip (it records the new version durably); if it raises, nothing flips.

        Raises:
            SwapInProgressError: another swap is running.
            SwapError: loading or validation failed (the active slot keeps serving; see ``last_error``).
        """
        if not self._swap_lock.acquire(blocking=False):
            raise SwapInProgressError(
                f"a swap to version {self._standby_version} is in progress; wait for it to finish, then retry"
            )
        started = self._clock()
        engine: E | None = None
        try:
            self._standby_version, self._state = version, "loading"
            try:
                engine = load(version)
                self._state = "validating"
                validate(engine, version)
                if commit is not None:
                    self._state = "recording"
                    commit(version, self._active.version)
            except Exception as exc:
                if engine is not None:
                    engine.close()  # type: ignore[attr-defined]
                self._last_error = f"version {version} refused while {self._state}: {exc}"
                raise SwapError(self._last_error) from exc
            self._state = "flipping"
            with self._lock:
                old, self._active = self._active, _Slot(version, engine, on_release=self._on_release)
                self.previous_version = old.version
                old.retired = True
                if not old.maybe_close():
                    self._retired.append(old)
            self._swaps += 1
            self._last_error = None
            self._last_swap_s = self._clock() - started
            return self._last_swap_s
        finally:
            self._standby_version, self._state = None, "serving"
            self._swap_lock.release()

    def status(self) -> SlotStatus:
        with self._lock:
            draining = len(self._retired)
        return SlotStatus(self._active.version, self._standby_version, self._state, self._last_error,
                          self._swaps, draining, self._last_swap_s, self.previous_version)

    def close(self) -> None:
        """Retire every slot; engines close once their leases end (idempotent)."""
        with self._lock:
            for slot in [self._active, *self._retired]:
                slot.retired = True
                slot.maybe_close()
            self._retired = [s for s in [self._active, *self._retired] if s.engine is not None]
