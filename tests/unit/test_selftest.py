"""The stub's load-time self-test: numpy 2 is refused, and an FP32 tensor that changes on its round trip
through DLPack fails the load (fastpath.triton.selftest)."""

import numpy as np
import pytest

from fastpath.errors import SelfTestError
from fastpath.triton.selftest import FP32_PROBE, check_numpy_version, check_round_trip


def _tensor_type(transform):
    """``pb_utils.Tensor``'s protocol over numpy's own DLPack: ``to_dlpack`` exports the array, ``from_dlpack``
    imports it (``np.from_dlpack``: a new array over the same memory) and applies ``transform``."""

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def to_dlpack(self):
            return self.array  # np.from_dlpack takes the exporting array itself

        @classmethod
        def from_dlpack(cls, name, exported):
            return cls(name, transform(np.from_dlpack(exported)))

        def as_numpy(self):
            return self.array

    return Tensor


def test_numpy_2_is_refused_with_version_and_fix():
    with pytest.raises(SelfTestError, match=r"numpy 2\.1\.0 .* needs numpy 1\.x .*numpy<2"):
        check_numpy_version("2.1.0")
    check_numpy_version("1.26.4")


def test_an_exact_round_trip_passes_and_any_change_of_value_dtype_or_shape_fails():
    """Invariant: the load passes only when the FP32 probe comes back with its bytes, dtype and shape,
    -0.0 and 3.25e-8 included."""
    check_round_trip(_tensor_type(lambda a: a))
    for changed in (lambda a: a.astype(np.float64), lambda a: a.reshape(-1), lambda a: np.abs(a),
                    lambda a: np.nextafter(a, np.float32(np.inf))):  # one ulp
        with pytest.raises(SelfTestError, match="SELFTEST_FP32 round trip"):
            check_round_trip(_tensor_type(changed))
    assert np.signbit(FP32_PROBE).any() and (FP32_PROBE != 0).any()
