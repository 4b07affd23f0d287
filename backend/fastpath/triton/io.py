"""A model's tensors: checking config.pbtxt's against the model's, reading requests, writing responses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastpath.errors import MAX_MESSAGE_CHARS, ConfigError, FastPathError, InvalidInputError, clipped


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model as ``config.pbtxt`` must declare it.

    Attributes:
        name: the tensor's name.
        data_type: Triton's type name, e.g. ``TYPE_FP32``, ``TYPE_STRING``.
        dims: the shape config.pbtxt declares (without the batch dimension when ``max_batch_size``
            > 0); -1 where the model takes any size, there the config may also fix one.
        optional: an input a request may omit (config.pbtxt ``optional: true``).
    """

    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False


def check_model_io(model_config: Mapping[str, Any], inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                   model: str) -> None:
    """Refuse a config whose inputs or outputs are not the model's: each side must declare the same
    names, and each tensor the same data type, rank, fixed sizes and ``optional`` flag.

    Args:
        model_config: the model's config as Triton passes it to ``initialize`` (``args["model_config"]``, parsed).
        inputs, outputs: the tensors the model reads and writes.
        model: the model's name, for the message.

    Raises:
        ConfigError: naming the tensor, the config's value and the model's.
    """
    for section, specs in (("input", inputs), ("output", outputs)):
        declared = {entry["name"]: entry for entry in model_config.get(section, ())}
        wanted = {spec.name: spec for spec in specs}
        if set(declared) != set(wanted):
            raise ConfigError(f"config.pbtxt {section}s of {model} are {sorted(declared)}: expected {sorted(wanted)}, the "
                              f"{section}s the model {'reads' if section == 'input' else 'writes'}")
        for name, spec in wanted.items():
            entry = declared[name]
            dims = tuple(int(d) for d in entry.get("dims", ()))
            found = (entry.get("data_type", "TYPE_INVALID"), dims, bool(entry.get("optional", False)))
            fits = (found[0] == spec.data_type and len(dims) == len(spec.dims) and found[2] == spec.optional
                    and all(want in (-1, got) for want, got in zip(spec.dims, dims)))
            if not fits:
                raise ConfigError(f"config.pbtxt {section} {name!r} of {model} is {_describe(*found)}: expected "
                                  f"{_describe(spec.data_type, spec.dims, spec.optional)} (-1 = any size)")


def _describe(data_type: str, dims: tuple[int, ...], optional: bool) -> str:
    return f"{data_type} dims {list(dims)}" + (" optional" if optional else "")


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


REQUEST_ID_CHARS = 200  # of a client's request id echoed in an error message


def error_response(pb_utils: Any, error: BaseException, request_id: str = "") -> Any:
    """An ``InferenceResponse`` carrying only ``error``, with the Triton code its type maps to.

    FastPath errors map to their ``triton_code`` (INVALID_ARG -> HTTP 400 / gRPC INVALID_ARGUMENT,
    UNAVAILABLE -> 503 / UNAVAILABLE); anything else is INTERNAL (500). A request's ``request_id`` (the
    client's ``id``) starts the message as Triton starts its own errors: ``[request id: <id>] ...``. The id is
    cut to :data:`REQUEST_ID_CHARS` characters and the message to ``MAX_MESSAGE_CHARS``, so that the error
    reaches a gRPC client whole (:data:`fastpath.errors.MAX_MESSAGE_CHARS`).
    """
    code_name = error.triton_code if isinstance(error, FastPathError) else "INTERNAL"
    code = getattr(pb_utils.TritonError, code_name, pb_utils.TritonError.INTERNAL)
    message = clipped(str(error) if isinstance(error, FastPathError) else f"{type(error).__name__}: {error}", MAX_MESSAGE_CHARS)
    if request_id:
        message = f"[request id: {clipped(request_id, REQUEST_ID_CHARS)}] {message}"
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
