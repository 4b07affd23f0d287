"""FastPath exceptions: one root, typed subclasses.

Messages say what was wrong, the offending value, and what to do (see ../shared/STYLE.md).
Each error carries the Triton status it maps to, so the Triton adapter answers a bad request
with HTTP 400 / gRPC INVALID_ARGUMENT and an overloaded server with 503 / UNAVAILABLE.
"""

from __future__ import annotations


class FastPathError(Exception):
    """Root of every FastPath exception.

    Attributes:
        triton_code: name of the ``pb_utils.TritonError`` code this error maps to
            (``"INTERNAL"`` unless a subclass says otherwise).
    """

    triton_code = "INTERNAL"


class ConfigError(FastPathError, ValueError):
    """A model configuration (``config.pbtxt`` parameters) is invalid: unknown key, bad value."""

    triton_code = "INVALID_ARG"


class InvalidInputError(FastPathError, ValueError):
    """A request's input is invalid; the request fails alone with HTTP 400 / INVALID_ARGUMENT."""

    triton_code = "INVALID_ARG"


class UnavailableError(FastPathError):
    """The server cannot take the request now (queue full, shutting down); retry later.

    Maps to HTTP 503 / gRPC UNAVAILABLE, which clients treat as retryable.
    """

    triton_code = "UNAVAILABLE"


class EngineError(FastPathError, RuntimeError):
    """An engine failed to load or to run a batch; only that batch's requests fail."""


class ArtifactError(FastPathError):
    """A model artifact is missing, corrupt (checksum mismatch) or incompatible with the config."""


class SelfTestError(FastPathError, RuntimeError):
    """The python-backend stub environment failed FastPath's load-time self-test."""
