"""Typed, validated model configuration built from ``config.pbtxt`` ``parameters``.

Triton hands a python-backend model its configuration as JSON (``args["model_config"]``); every
``parameters { key: ... value: { string_value: ... } }`` entry arrives as a string. FastPath parses
them into frozen, keyword-only dataclasses, converting each value by the field's annotation and
validating in ``__post_init__``. An unknown key is an error that names the key and lists the known
ones, so a typo never silently falls back to a default.

Reference: Triton ``model_config.proto`` (``ModelParameter``), python_backend ``examples/add_sub``.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from fastpath.errors import ConfigError

T = TypeVar("T")

RUNTIMES = ("onnxruntime", "torch", "tensorrt")
PRECISIONS = ("fp32", "fp16", "int8", "fp8")


def _convert(key: str, raw: str, annotation: Any) -> Any:
    """Convert one parameter string to the annotated type; raise ConfigError naming the key."""
    text = raw.strip()
    try:
        if annotation is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true/false")
        if annotation is int:
            return int(text)
        if annotation is float:
            return float(text)
        if annotation is str:
            return text
        if typing.get_origin(annotation) is tuple:
            (item_type, *_rest) = typing.get_args(annotation)
            return tuple(item_type(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError as exc:
        raise ConfigError(
            f"config.pbtxt parameter {key!r} = {raw!r} is not a valid {getattr(annotation, '__name__', annotation)}: {exc}"
        ) from None
    raise ConfigError(f"parameter {key!r} has an unsupported type {annotation!r}")  # programming error


def parse_parameters(cls: type[T], parameters: Mapping[str, str]) -> T:
    """Build the dataclass ``cls`` from string parameters.

    Args:
        cls: a dataclass whose fields all have defaults.
        parameters: key -> string value, e.g. from :func:`triton_parameters`.

    Returns:
        An instance of ``cls`` (validated by its ``__post_init__``).

    Raises:
        ConfigError: a key is unknown, or a value does not convert or validate.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(parameters) - fields)
    if unknown:
        raise ConfigError(
            f"unknown config.pbtxt parameter {unknown[0]!r} for {cls.__name__}; "
            f"known parameters: {', '.join(sorted(fields))}"
        )
    values = {key: _convert(key, value, hints[key]) for key, value in parameters.items()}
    return cls(**values)


def triton_parameters(model_config: Mapping[str, Any] | str) -> dict[str, str]:
    """Extract ``parameters`` from Triton's model config (dict or its JSON string).

    Triton writes each entry as ``{"key": {"string_value": "..."}}``.
    """
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    params = config.get("parameters") or {}
    return {key: str(value.get("string_value", "")) for key, value in params.items()}


def _check(condition: bool, key: str, value: Any, expectation: str) -> None:
    if not condition:
        raise ConfigError(f"config.pbtxt parameter {key!r} = {value!r}: expected {expectation}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextEmbeddingConfig:
    """Parameters of a FastPath text-embedding model (``config.pbtxt`` ``parameters``).

    Attributes:
        runtime: engine runtime, one of ``RUNTIMES``; ``onnxruntime`` (CPU execution provider) is
            the default that runs everywhere.
        precision: ``fp32`` | ``fp16`` | ``int8`` | ``fp8``; selects the artifact of that precision.
        artifact: ONNX file name inside the model version directory.
        tokenizer: tokenizer file name inside the model version directory (HF ``tokenizer.json``).
        intra_op_threads: ONNX Runtime intra-op threads; 0 lets ONNX Runtime choose (one per core).
        max_seq_length: truncation length in tokens, [CLS] and [SEP] included. 256 is
            all-MiniLM-L6-v2's ``max_seq_length`` (sentence_bert_config.json).
        max_text_bytes: largest accepted UTF-8 size of one text, in bytes; larger texts get a 400
            before tokenization (../shared/cases K07).
        max_batch_texts: most texts the engine runs in one call.
        length_buckets_tokens: padded sequence lengths; a batch pads to the smallest bucket that
            holds its longest member, never beyond ``max_seq_length``.
    """

    runtime: str = "onnxruntime"
    precision: str = "fp32"
    artifact: str = "model.onnx"
    tokenizer: str = "tokenizer.json"
    intra_op_threads: int = 0
    max_seq_length: int = 256
    max_text_bytes: int = 1 << 20
    max_batch_texts: int = 64
    length_buckets_tokens: tuple[int, ...] = (16, 32, 64, 128, 256)

    def __post_init__(self) -> None:
        _check(self.runtime in RUNTIMES, "runtime", self.runtime, f"one of {', '.join(RUNTIMES)}")
        _check(self.precision in PRECISIONS, "precision", self.precision, f"one of {', '.join(PRECISIONS)}")
        _check(self.intra_op_threads >= 0, "intra_op_threads", self.intra_op_threads, ">= 0")
        _check(2 <= self.max_seq_length <= 512, "max_seq_length", self.max_seq_length, "2..512 (BERT positions)")
        _check(self.max_text_bytes > 0, "max_text_bytes", self.max_text_bytes, "> 0")
        _check(self.max_batch_texts > 0, "max_batch_texts", self.max_batch_texts, "> 0")
        buckets = self.length_buckets_tokens
        _check(
            len(buckets) > 0 and list(buckets) == sorted(set(buckets)) and buckets[0] > 0,
            "length_buckets_tokens",
            buckets,
            "a non-empty, strictly increasing list of positive token counts",
        )
