"""Protocol-independent pieces: model specs from Triton's config, input arrays, texts, statistics.

Nothing here talks to a server, so the sync and async clients share it and unit tests cover it alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from fastpath_client.errors import InvalidInputError, ServerError

STAT_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One input or output of a model config.

    Attributes:
        name: tensor name.
        datatype: Triton wire datatype ("FP32", "UINT8", "BYTES", ...), from config ``TYPE_*``.
        dims: dims from the config, without the batch dimension; -1 is variable.
        optional: whether an input may be left out.
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What a client needs from a model's config (``model_config.proto``).

    Attributes:
        name: model name.
        max_batch_size: 0 when the model does not batch (then dims are full shapes).
        inputs, outputs: the tensors, in config order.
        max_queue_items: items (texts, images) the server queues for the model before it answers
            busy: FastPath's ``max_queue_texts`` (text_embedding) or ``max_queue_images``
            (text_detection) parameter; None when the config does not say.
        max_queue_requests: requests Triton's dynamic batcher queues
            (``default_queue_policy.max_queue_size``); None when unlimited or not set.
    """

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_queue_items: int | None = None
    max_queue_requests: int | None = None

    def input(self, name: str) -> TensorSpec:
        """The input called ``name``.

        Raises:
            InvalidInputError: the model has no such input (the message lists the ones it has).
        """
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise InvalidInputError(f"model '{self.name}' has no input '{name}'; inputs: {[s.name for s in self.inputs]}")

    def full_dims(self, spec: TensorSpec) -> tuple[int, ...]:
        """``spec.dims`` with the batch dimension (-1) in front when the model batches."""
        return ((-1,) if self.max_batch_size > 0 else ()) + spec.dims


def _tensor(entry: Mapping[str, Any]) -> TensorSpec:
    datatype = str(entry.get("data_type", "TYPE_INVALID")).removeprefix("TYPE_")
    return TensorSpec(
        name=entry["name"],
        datatype="BYTES" if datatype == "STRING" else datatype,
        dims=tuple(int(d) for d in entry.get("dims", ())),
        optional=bool(entry.get("optional", False)),
    )


def model_spec(config: Mapping[str, Any]) -> ModelSpec:
    """A :class:`ModelSpec` from ``get_model_config`` output: HTTP's JSON, or gRPC's ``as_json=True``
    (``{"config": {...}}`` with int64 fields as strings)."""
    config = config.get("config", config)
    return ModelSpec(
        name=config["name"],
        max_batch_size=int(config.get("max_batch_size", 0)),
        inputs=tuple(_tensor(t) for t in config.get("input", ())),
        outputs=tuple(_tensor(t) for t in config.get("output", ())),
        max_queue_items=_positive(_parameter(config, "max_queue_texts") or _parameter(config, "max_queue_images")),
        max_queue_requests=_positive(config.get("dynamic_batching", {}).get("default_queue_policy", {}).get("max_queue_size")),
    )


def _parameter(config: Mapping[str, Any], key: str) -> Any:
    """A ``parameters`` entry's string value (HTTP's JSON and gRPC's ``as_json`` spell it alike)."""
    entry = config.get("parameters", {}).get(key, {})
    return entry.get("string_value") if isinstance(entry, Mapping) else None


def _positive(value: Any) -> int | None:
    """``value`` as a positive int; None when it is missing, 0 (Triton's "no limit") or not a number."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def text_sequence(texts: Iterable[str | bytes], *, name: str = "TEXT") -> Sequence[str | bytes] | np.ndarray:
    """``texts`` as a sequence: sequences and arrays as given, any other iterable (a generator) as a list.

    Raises:
        InvalidInputError: ``texts`` is not iterable.
    """
    if isinstance(texts, (Sequence, np.ndarray)):
        return texts
    try:
        return list(texts)
    except TypeError:
        raise InvalidInputError(f"{name}: expected an iterable of str or bytes, got {type(texts).__name__}") from None


def text_array(texts: Sequence[str | bytes], *, name: str = "TEXT") -> np.ndarray:
    """Texts as an object array of UTF-8 ``bytes``, shape [n, 1].

    Object arrays keep every byte: numpy ``S``/``U`` arrays drop trailing NULs (``b"abc\\x00"`` would
    arrive as ``b"abc"``). ``bytes`` items are sent as given, so invalid UTF-8 reaches the server's policy.

    Raises:
        InvalidInputError: ``texts`` is a single str/bytes, a numpy ``S``/``U`` array (its trailing NULs
            are already gone: refused as :func:`wire_array` refuses it for ``infer``), holds
            something else than str/bytes, or a str with a lone surrogate (not encodable as UTF-8).
    """
    if isinstance(texts, np.ndarray) and texts.dtype.kind in "SU":
        raise InvalidInputError(f"{name}: numpy {texts.dtype} arrays drop trailing NUL bytes and are refused; "
                                "pass a list of str/bytes or an object array (np.array(items, dtype=object))")
    if isinstance(texts, (str, bytes)):
        raise InvalidInputError(f"{name}: expected a sequence of texts, got a single {type(texts).__name__}; "
                                "wrap it in a list: embed([text])")
    array = np.empty((len(texts), 1), dtype=np.object_)
    for index, text in enumerate(texts):
        if isinstance(text, str):
            try:
                array[index, 0] = text.encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from a bad "\ud800" escape or surrogateescape
                raise InvalidInputError(f"{name}[{index}]: character {exc.object[exc.start]!r} at position {exc.start} "
                                        f"cannot be encoded as UTF-8 ({exc.reason}); pass valid text, or bytes") from None
        elif isinstance(text, (bytes, bytearray, memoryview)):
            array[index, 0] = bytes(text)
        else:
            raise InvalidInputError(f"{name}[{index}]: expected str or bytes, got {type(text).__name__}")
    return array


def wire_array(name: str, value: Any) -> tuple[np.ndarray, str]:
    """Check one input value and return it as a C-contiguous array with its Triton datatype.

    Raises:
        InvalidInputError: a numpy ``S``/``U`` array (loses trailing NULs: pass an object array or a
            list), or an unsupported dtype.
    """
    array = np.asarray(value)
    if array.dtype.kind in "SU" and not isinstance(value, np.ndarray):
        array = np.array(value, dtype=np.object_)  # from the list itself: nothing was lost yet
    if array.dtype.kind in "SU":
        raise InvalidInputError(
            f"input {name}: numpy {array.dtype} arrays drop trailing NUL bytes and are refused; "
            "pass an object array of bytes/str (np.array(items, dtype=object)) or a list"
        )
    if array.dtype == np.object_:
        return array, "BYTES"
    datatype = np_to_triton_dtype(array.dtype)
    if datatype is None:
        raise InvalidInputError(f"input {name}: numpy dtype {array.dtype} has no Triton datatype")
    return np.ascontiguousarray(array), datatype


def chunks(count: int, size: int) -> list[slice]:
    """Slices that cover ``range(count)`` in pieces of at most ``size`` (``size`` <= 0: one piece; none for 0)."""
    if count == 0:
        return []
    if size <= 0 or count <= size:
        return [slice(0, count)]
    return [slice(start, min(start + size, count)) for start in range(0, count, size)]


def renumber_items(message: str, tensors: Sequence[str], offset: int) -> str:
    """``message`` with the element indexes it gives for ``tensors`` moved up by ``offset``.

    The server numbers the elements of the request it received: ``TEXT[6]``, ``input IMAGE image 0``,
    ``input IMAGE_BYTES element 0``. When the client split the caller's items into several requests,
    the request that starts at item ``offset`` of the caller's sequence reports item ``offset + 6`` as
    ``TEXT[6]``; this turns it back into ``TEXT[70]`` (and ``image 0`` of the request that carries
    image 5 into ``image 5``). Other numbers are left alone.
    """
    if offset == 0 or not tensors:
        return message
    names = "|".join(re.escape(name) for name in tensors)
    shift = lambda match: f"{match.group(1)}{int(match.group(2)) + offset}"  # noqa: E731
    message = re.sub(rf"(?<![\w])((?:{names})\[)(\d+)(?=\])", shift, message)
    return re.sub(rf"(?<![\w])((?:input )?(?:{names}) (?:image|element) )(\d+)(?!\w)", shift, message)


def check_rows(model: str, output: str, array: np.ndarray, rows: int, width: int | None = None) -> np.ndarray:
    """Check an output has ``rows`` rows (and ``width`` columns); return it.

    Raises:
        ServerError: the shape differs; the message names both shapes.
    """
    expected = (rows, width) if width is not None else (rows,)
    if array.shape[0] != rows or (width is not None and array.shape[1:] != (width,)):
        raise ServerError(f"model '{model}' returned {output} with shape {list(array.shape)} for {rows} rows; "
                         f"expected {list(expected)}")
    return array


def _count_ns(entry: Mapping[str, Any] | None) -> tuple[int, int]:
    entry = entry or {}
    return int(entry.get("count", 0) or 0), int(entry.get("ns", 0) or 0)


def model_statistics(stats: Mapping[str, Any], model: str) -> dict[str, tuple[int, int]]:
    """Cumulative ``(count, ns)`` per phase of ``model`` (all versions summed) from ``get_inference_statistics``.

    Phases are Triton's: success, fail, queue, compute_input, compute_infer, compute_output (plus
    ``inference_count`` and ``execution_count`` as ``(count, 0)``). Works on HTTP's JSON and on gRPC's
    ``as_json=True`` dict (int64 as strings).
    """
    totals = {phase: (0, 0) for phase in STAT_PHASES + ("inference_count", "execution_count")}
    for entry in stats.get("model_stats", ()):
        if entry.get("name") != model:
            continue
        phases = entry.get("inference_stats", {})
        for phase in STAT_PHASES:
            count, ns = _count_ns(phases.get(phase))
            totals[phase] = (totals[phase][0] + count, totals[phase][1] + ns)
        for key in ("inference_count", "execution_count"):
            totals[key] = (totals[key][0] + int(entry.get(key, 0) or 0), 0)
    return totals


def repository_versions(index: Any, model: str) -> list[dict[str, str]]:
    """Entries of ``model`` in a repository index (HTTP list, or gRPC ``{"models": [...]}``), by version."""
    entries = index.get("models", ()) if isinstance(index, Mapping) else index
    rows = [
        {"name": e.get("name", ""), "version": str(e.get("version", "")), "state": e.get("state", ""),
         "reason": e.get("reason", "")}
        for e in entries
        if e.get("name") == model
    ]
    return sorted(rows, key=lambda row: (len(row["version"]), row["version"]))


def typed_empty(result: Any, name: str, array: np.ndarray) -> np.ndarray:
    """An empty output in the dtype the response names: tritonclient 2.51's HTTP client returns a
    zero-size binary output as float64 whatever its datatype (text_detection's BOXES of an image without text)."""
    from tritonclient.utils import triton_to_np_dtype

    output = result.get_output(name)
    datatype = output["datatype"] if isinstance(output, dict) else output.datatype
    dtype = triton_to_np_dtype(datatype)
    return array.astype(dtype) if dtype is not None and datatype != "BYTES" else array
