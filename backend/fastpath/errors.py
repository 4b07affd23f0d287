"""FastPath exceptions: one root, typed subclasses.

Messages say what was wrong, the offending value, and what to do.
Each error carries the Triton status it maps to, so the Triton adapter answers a bad request
with HTTP 400 / gRPC INVALID_ARGUMENT and an overloaded server with 503 / UNAVAILABLE.
"""

from __future__ import annotations

# Longest error message a response carries, in characters: gRPC sends the message in a header, and clients refuse
# headers past 8 KiB (grpc-core's default soft limit, on the percent-encoded bytes), which would replace the
# real code and message with a transport error (RESOURCE_EXHAUSTED).
MAX_MESSAGE_CHARS = 2000


def clipped(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters plus a note of its length, for echoing a client's value
    (a request id, a parameter) or a long message back without the echo outgrowing the response."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... (cut; {len(text)} characters in all)"


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


class QueueTimeoutError(UnavailableError):
    """A request was still queued when its timeout passed (Triton: "Request timeout expired", UNAVAILABLE)."""


class RequestCancelledError(FastPathError):
    """The client cancelled the request before it ran; maps to Triton's CANCELLED."""

    triton_code = "CANCELLED"


class SwapError(FastPathError):
    """A swap failed; the active version keeps serving. The message names the stage and the reason."""

    triton_code = "INVALID_ARG"


class SwapInProgressError(SwapError):
    """Another swap of the same model instance is running; try again when it has finished."""

    triton_code = "UNAVAILABLE"


class PermissionDeniedError(FastPathError):
    """A mutating command came without the right admin key."""

    triton_code = "INVALID_ARG"  # Triton 2.51's python backend has no PERMISSION_DENIED code mapping to HTTP 403


class BenchError(FastPathError):
    """bench cannot run; the message is the one line the CLI prints."""


class AccuracyGateError(ArtifactError):
    """A quantized artifact is too far from its fp32 reference; the build fails."""


class NotLoadedError(FastPathError):
    """``status`` found no live FastPath instance of the model; the message says whether it is loaded."""


class ServerError(FastPathError, RuntimeError):
    """tritonserver could not be started, did not become ready, or exited."""


class LeaseError(FastPathError, RuntimeError):
    """A lease was misused: released twice, released to another pool, or viewed after release."""


class CudaError(FastPathError, RuntimeError):
    """A CUDA runtime call failed.

    Attributes:
        error_name: CUDA's name for the status, e.g. ``"cudaErrorMemoryAllocation"``.
        call: what was being done, e.g. ``"cudaHostAlloc(16777216 bytes)"``.
    """

    def __init__(self, message: str, *, error_name: str = "", call: str = "") -> None:
        super().__init__(message)
        self.error_name = error_name
        self.call = call


class VersionRecordError(FastPathError):
    """A model's serving-version record (``fastpath.swaps.record``) cannot be read or written."""
