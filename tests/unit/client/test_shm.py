"""Shared-memory regions: selection policy, local-host detection, create/destroy without leaks."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.utils.shared_memory as tshm

from fastpath_client import InvalidInputError
from fastpath_client.shm import (
    RegionPool,
    SharedMemoryPolicy,
    create_region,
    is_local_url,
    leaked_regions,
    new_region,
    size_class,
)


@pytest.mark.parametrize(("url", "local"), [("127.0.0.1:8000", True), ("localhost:8001", True), ("[::1]:8000", True),
                                            ("127.3.4.5:1", True), ("10.0.0.7:8000", False), ("triton.example:8000", False)])
def test_is_local_url(url, local):
    assert is_local_url(url) is local


def test_policy_selects_large_non_bytes_inputs_on_this_host_only():
    policy = SharedMemoryPolicy(threshold_bytes=1000)
    big, small = np.zeros(1000, np.uint8), np.zeros(999, np.uint8)
    assert policy.selects(big, "UINT8", local=True) and not policy.selects(small, "UINT8", local=True)
    assert not policy.selects(big, "UINT8", local=False) and not policy.selects(big, "BYTES", local=True)
    assert SharedMemoryPolicy(mode="always").selects(small, "UINT8", local=False)
    assert not SharedMemoryPolicy(mode="never").selects(big, "UINT8", local=True)
    with pytest.raises(InvalidInputError, match="'auto', 'always' or 'never'"):
        SharedMemoryPolicy(mode="sometimes")


def test_region_holds_the_arrays_at_aligned_offsets_and_is_unlinked():
    arrays = [np.arange(100, dtype=np.float32), np.arange(7, dtype=np.uint8).reshape(7, 1)]
    region = create_region(arrays)
    try:
        assert region.offsets == [0, 448] and region.byte_size == 512
        assert leaked_regions(os.getpid()) == [region.key]
        assert np.array_equal(tshm.get_contents_as_numpy(region.handle, np.float32, [100], 0), arrays[0])
        assert np.array_equal(tshm.get_contents_as_numpy(region.handle, np.uint8, [7, 1], 448), arrays[1])
    finally:
        region.destroy()
        region.destroy()  # idempotent
    assert leaked_regions(os.getpid()) == []


def test_size_classes_are_powers_of_two_from_64_kib():
    assert [size_class(n) for n in (1, 65536, 65537, 39_321_600)] == [65536, 65536, 131072, 67_108_864]


def test_pool_hands_out_the_smallest_fitting_region_and_evicts_the_oldest():
    pool = RegionPool(max_idle_bytes=3 << 20)
    small, large = new_region(1 << 20), new_region(2 << 20)
    try:
        assert pool.take(1) is None
        assert pool.give(large) == [] and pool.give(small) == []
        assert pool.take(1000) is small and pool.take(1000) is large and pool.take(1) is None
        extra = new_region(2 << 20)
        pool.give(large)
        pool.give(small)
        assert pool.give(extra) == [large]  # 5 MiB idle > 3 MiB: the oldest goes
        assert pool.drain() == [small, extra] and pool.drain() == []
    finally:
        for region in (small, large, extra):
            region.destroy()
    assert leaked_regions(os.getpid()) == []


def test_write_refuses_what_does_not_fit():
    region = new_region(1 << 16)
    try:
        with pytest.raises(ValueError, match="do not fit"):
            region.write([np.zeros(1 << 17, np.uint8)])
    finally:
        region.destroy()
