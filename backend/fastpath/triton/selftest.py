"""Load-time self-test of the python-backend stub environment.

Triton 2.51's python-backend stub is compiled against numpy 1.x. With numpy 2.x in the stub,
every response fails with "output tensor shape does not match size of output". FastPath refuses to load in such an environment, with a message that
says why, instead of failing every request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastpath.errors import SelfTestError

BYTES_PROBE = np.array([b"ABC", b"", "日本".encode(), b"a\x00b"], dtype=np.object_)
FP32_PROBE = np.array([[0.0, -1.5, 3.25e-8], [np.pi, 1e30, -0.0]], dtype=np.float32)


def check_numpy_version(version: str) -> None:
    """Refuse numpy 2.x, which the Triton 2.51 stub cannot serialize.

    Raises:
        SelfTestError: naming the version found and the fix.
    """
    major = int(version.split(".", 1)[0])
    if major >= 2:
        raise SelfTestError(
            f"numpy {version} is loaded in the python-backend stub, but Triton 2.51's stub needs numpy 1.x "
            "(with 2.x every response fails with 'output tensor shape does not match size of output'); "
            "install numpy<2 in the environment whose python3 is first on PATH when tritonserver starts"
        )


def check_round_trip(make_tensor: Callable[[str, np.ndarray], Any]) -> None:
    """Round-trip a BYTES and an FP32 tensor through the stub's tensor type; compare byte-exactly.

    Args:
        make_tensor: ``pb_utils.Tensor`` (name, array) -> tensor with ``as_numpy()``.

    Raises:
        SelfTestError: a value, dtype or shape changed on the way.
    """
    for name, probe in (("SELFTEST_BYTES", BYTES_PROBE), ("SELFTEST_FP32", FP32_PROBE)):
        back = np.asarray(make_tensor(name, probe).as_numpy())
        same = back.shape == probe.shape and (
            list(back.reshape(-1)) == list(probe.reshape(-1))
            if probe.dtype == np.object_
            else back.dtype == probe.dtype and back.tobytes() == probe.tobytes()
        )
        if not same:
            raise SelfTestError(
                f"the python-backend stub corrupted a {name} round trip: sent {probe!r}, got back {back!r} "
                f"(numpy {np.__version__}); the stub environment is broken"
            )


def run_self_test(make_tensor: Callable[[str, np.ndarray], Any]) -> None:
    """Run every check; raise :class:`SelfTestError` on the first failure."""
    check_numpy_version(np.__version__)
    check_round_trip(make_tensor)
