"""Load-time self-test of the python-backend stub environment.

Triton 2.51's python-backend stub is compiled against numpy 1.x. With numpy 2.x in the stub,
every response fails with "output tensor shape does not match size of output". FastPath refuses to load in
such an environment, with a message that says why, instead of failing every request.

What a load can check: ``pb_utils.Tensor(name, array).as_numpy()`` hands back the array it was given (the
same object: seen with Triton 2.51), so comparing it checks nothing. The FP32 probe goes through the stub's
own memory instead: ``to_dlpack`` exports the tensor, ``Tensor.from_dlpack`` makes a new one of it, and its
``as_numpy()`` is a new array built by the stub's C++. DLPack has no strings, so BYTES cannot make a round trip
before the model serves; the numpy version check guards them, and the e2e tests send BYTES byte-exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastpath.errors import SelfTestError

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


def check_round_trip(tensor_type: Any) -> None:
    """Round-trip an FP32 tensor through the stub's tensor memory (DLPack); compare byte-exactly.

    Args:
        tensor_type: ``pb_utils.Tensor``: ``tensor_type(name, array)`` with ``to_dlpack()``, and
            ``tensor_type.from_dlpack(name, capsule)`` with ``as_numpy()``.

    Raises:
        SelfTestError: the value, dtype or shape changed on the way.
    """
    name = "SELFTEST_FP32"
    back = np.asarray(tensor_type.from_dlpack(name, tensor_type(name, FP32_PROBE).to_dlpack()).as_numpy())
    if not (back.shape == FP32_PROBE.shape and back.dtype == FP32_PROBE.dtype and back.tobytes() == FP32_PROBE.tobytes()):
        raise SelfTestError(
            f"the python-backend stub corrupted a {name} round trip: sent {FP32_PROBE!r}, got back {back!r} "
            f"(numpy {np.__version__}); the stub environment is broken"
        )


def run_self_test(tensor_type: Any) -> None:
    """Run every check with ``pb_utils.Tensor``; raise :class:`SelfTestError` on the first failure."""
    check_numpy_version(np.__version__)
    check_round_trip(tensor_type)
