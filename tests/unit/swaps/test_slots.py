"""EngineSlots: flip, leases, drain, failure isolation, refusal of overlapping swaps."""

import threading

import pytest

from fastpath.errors import SwapError, SwapInProgressError
from fastpath.swaps.slots import EngineSlots


class Engine:
    """A real object with the only engine method slots use: close() (counted)."""

    def __init__(self, version):
        self.version = version
        self.closed = 0

    def close(self):
        self.closed += 1


def _ok(engine, version):
    return None


def test_swap_flips_and_releases_old_engine_when_idle():
    v1 = Engine(1)
    slots = EngineSlots(1, v1)
    seconds = slots.swap(2, Engine, _ok)
    assert seconds >= 0
    with slots.lease() as (engine, version):
        assert (engine.version, version) == (2, 2)
    assert v1.closed == 1
    status = slots.status()
    assert (status.active_version, status.previous_version, status.swaps, status.draining) == (2, 1, 1, 0)


def test_dispatched_batch_finishes_on_old_slot_then_old_is_released():
    v1 = Engine(1)
    slots = EngineSlots(1, v1)
    with slots.lease() as (engine, version):
        slots.swap(2, Engine, _ok)
        assert (engine, version) == (v1, 1)  # the batch in flight keeps its slot
        assert v1.closed == 0 and slots.status().draining == 1
        with slots.lease() as (new_engine, new_version):
            assert new_version == 2  # new batches go to the new slot at once
    assert v1.closed == 1 and slots.status().draining == 0


@pytest.mark.parametrize("stage", ["load", "validate"])
def test_failure_leaves_active_serving_and_records_reason(stage):
    v1 = Engine(1)
    slots = EngineSlots(1, v1)
    loaded = []

    def load(version):
        if stage == "load":
            raise FileNotFoundError("model.onnx missing")
        loaded.append(Engine(version))
        return loaded[-1]

    def validate(engine, version):
        raise ValueError("golden cosine 0.91 < 0.99")

    with pytest.raises(SwapError, match=f"version 3 refused while {'loading' if stage == 'load' else 'validating'}"):
        slots.swap(3, load, validate)
    assert slots.active_version == 1 and v1.closed == 0
    assert all(e.closed == 1 for e in loaded)  # the refused standby is released
    assert "refused" in slots.status().last_error


def test_overlapping_swap_is_refused_with_clear_message():
    slots = EngineSlots(1, Engine(1))
    entered, release = threading.Event(), threading.Event()

    def slow_load(version):
        entered.set()
        release.wait(5)
        return Engine(version)

    worker = threading.Thread(target=slots.swap, args=(2, slow_load, _ok))
    worker.start()
    assert entered.wait(5)
    assert slots.status().state == "loading" and slots.status().standby_version == 2
    with pytest.raises(SwapInProgressError, match="a swap to version 2 is in progress"):
        slots.swap(3, Engine, _ok)
    release.set()
    worker.join(5)
    assert slots.active_version == 2


def test_close_releases_everything_once():
    v1 = Engine(1)
    slots = EngineSlots(1, v1)
    slots.close()
    slots.close()
    assert v1.closed == 1
