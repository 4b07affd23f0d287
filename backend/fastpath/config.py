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
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from fastpath.errors import ConfigError

T = TypeVar("T")

RUNTIMES = ("onnxruntime", "torch", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")


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


def check_parameter(condition: bool, key: str, value: Any, expectation: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, ``value`` and the ``expectation`` unless ``condition``.

    Shared by every FastPath config dataclass's ``__post_init__`` (text and vision models, scheduler).
    """
    if not condition:
        raise ConfigError(f"config.pbtxt parameter {key!r} = {value!r}: expected {expectation}")


def parse_sections(parameters: Mapping[str, str], *classes: type, model: str = "") -> tuple[Any, ...]:
    """Split one model's parameters among several config dataclasses and build each.

    Each key goes to the dataclass that declares it; a key no class declares is a parameter the
    model does not use: an error that names the key (and ``model``) and lists every known parameter.

    Args:
        parameters: key -> string value, e.g. from :func:`triton_parameters`.
        *classes: dataclasses with disjoint field names, e.g. ``TextEmbeddingConfig, EmbeddingSchedulerConfig``.
        model: the model's name, for the message.

    Returns:
        One instance per class, in the order given.

    Raises:
        ConfigError: a key is unknown, or a value does not convert or validate.
    """
    owners = {f.name: cls for cls in classes for f in dataclasses.fields(cls)}
    unknown = sorted(set(parameters) - set(owners))
    if unknown:
        whose = f" ({model} does not use it)" if model else ""
        raise ConfigError(
            f"unknown config.pbtxt parameter {unknown[0]!r}{whose}; known parameters: {', '.join(sorted(owners))}"
        )
    return tuple(
        parse_parameters(cls, {k: v for k, v in parameters.items() if owners[k] is cls}) for cls in classes
    )


def instance_device(args: Mapping[str, str], configured_device: str | None, *, runtime: str,
                    gpu_runtimes: Collection[str]) -> str:
    """The device one model instance runs on: where Triton placed it, else the ``device`` parameter.

    ``KIND_GPU``: ``cuda:<model_instance_device_id>``, Triton's placement; the ``device`` parameter may be
    unset, ``cuda`` or that same ``cuda:N``, anything else is refused, not overridden. Other kinds (``KIND_CPU``,
    ``KIND_AUTO`` resolved to the CPU, ``KIND_MODEL``): the ``device`` parameter as written, ``cpu`` when unset.
    Why, and how to pin instances to a GPU: docs/deployment.md#serving-text_embedding-on-a-gpu ("Placement").

    Args:
        args: Triton's ``initialize`` arguments (a missing ``model_instance_kind`` counts as CPU).
        configured_device: the ``device`` parameter as written, or None when the config does not set it.
        runtime: the model's ``runtime`` parameter.
        gpu_runtimes: the runtimes this model can run on a GPU (empty: the model has no GPU path).

    Returns:
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Raises:
        ConfigError: a ``KIND_GPU`` instance whose ``runtime`` is not in ``gpu_runtimes``, whose ``device``
            is ``cpu`` or another GPU, or whose device id is not a GPU ordinal (named, with the value).
    """
    if str(args.get("model_instance_kind", "CPU")).upper() != "GPU":
        return configured_device if configured_device is not None else "cpu"
    raw_id = str(args.get("model_instance_device_id", ""))
    if not raw_id.isdigit():
        raise ConfigError(f"Triton's model_instance_device_id = {raw_id!r} for a KIND_GPU instance: expected a GPU ordinal (0, 1, ...)")
    assigned = f"cuda:{int(raw_id)}"
    instance = args.get("model_instance_name") or args.get("model_name") or "this instance"
    if runtime not in gpu_runtimes:
        expected = (f"runtime one of {', '.join(gpu_runtimes)} with KIND_GPU, or instance_group kind KIND_CPU" if gpu_runtimes
                    else "instance_group kind KIND_CPU (this model has no GPU engine)")
        raise ConfigError(f"config.pbtxt parameter 'runtime' = {runtime!r}: instance_group kind KIND_GPU placed {instance} "
                          f"on {assigned}, and this model runs no GPU engine with that runtime; expected {expected}")
    if configured_device not in (None, "cuda", assigned):
        raise ConfigError(f"config.pbtxt parameter 'device' = {configured_device!r} contradicts instance_group kind KIND_GPU, "
                          f"which placed {instance} on {assigned}: expected the parameter unset, 'cuda' or {assigned!r} "
                          "(choose the GPU with the instance group's gpus: [N]), or instance_group kind KIND_CPU to run "
                          f"on {configured_device!r}")
    return assigned
