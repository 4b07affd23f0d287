import numpy as np
import pytest

from fastpath.errors import SelfTestError
from fastpath.triton.selftest import BYTES_PROBE, check_numpy_version, check_round_trip


class _Tensor:
    """The tensor protocol the check uses (name, array) -> as_numpy(), applying a given transform."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, name, array):
        self.array = self.transform(array)
        return self

    def as_numpy(self):
        return self.array


def test_numpy_2_is_refused_with_version_and_fix():
    with pytest.raises(SelfTestError, match=r"numpy 2\.1\.0 .* needs numpy 1\.x .*numpy<2"):
        check_numpy_version("2.1.0")
    check_numpy_version("1.26.4")


def test_round_trip_passes_on_exact_copy_and_fails_on_corruption():
    check_round_trip(_Tensor(lambda a: a.copy()))
    with pytest.raises(SelfTestError, match="SELFTEST_BYTES"):
        check_round_trip(_Tensor(lambda a: a[:-1] if a.dtype == object else a))
    with pytest.raises(SelfTestError, match="SELFTEST_FP32"):
        check_round_trip(_Tensor(lambda a: a if a.dtype == object else a.astype(np.float64)))


def test_bytes_probe_keeps_embedded_nul():
    assert b"a\x00b" in list(BYTES_PROBE)
