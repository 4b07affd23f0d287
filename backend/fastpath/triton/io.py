"""Reading request tensors and writing responses in the python backend."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastpath.errors import FastPathError, InvalidInputError


def read_input(pb_utils: Any, request: Any, name: str) -> np.ndarray:
    """Return input ``name`` of ``request`` as a numpy array.

    Raises:
        InvalidInputError: the input is missing, or has a zero-sized dimension.
    """
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise InvalidInputError(f"input {name} is missing from the request")
    array = tensor.as_numpy()
    if array.size == 0:
        raise InvalidInputError(
            f"input {name} has shape {list(array.shape)} with a zero-sized dimension; "
            "send at least one element in every dimension"
        )
    return array


def input_rows(pb_utils: Any, request: Any, name: str) -> int | None:
    """The batch dimension (first dim) of input ``name`` without reading its data; None when the
    request lacks it, 0 for a scalar. For checks before costly work (inline eligibility, queue room)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    shape = tensor.shape() if hasattr(tensor, "shape") else tensor.as_numpy().shape
    return int(shape[0]) if len(shape) else 0


def error_response(pb_utils: Any, error: BaseException) -> Any:
    """An ``InferenceResponse`` carrying only ``error``, with the Triton code its type maps to.

    FastPath errors map to their ``triton_code`` (INVALID_ARG -> HTTP 400 / gRPC INVALID_ARGUMENT,
    UNAVAILABLE -> 503 / UNAVAILABLE); anything else is INTERNAL (500).
    """
    code_name = error.triton_code if isinstance(error, FastPathError) else "INTERNAL"
    code = getattr(pb_utils.TritonError, code_name, pb_utils.TritonError.INTERNAL)
    message = str(error) if isinstance(error, FastPathError) else f"{type(error).__name__}: {error}"
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
