"""FastPath client SDK: embeddings, text detection and any Triton model over HTTP or gRPC.

Depends only on ``tritonclient`` and ``numpy`` (``matplotlib`` for bench plots, the ``plots`` extra);
it never imports the ``fastpath`` server package.

    >>> from fastpath_client import Client
    >>> with Client("localhost:8000", protocol="http") as client:
    ...     client.wait_ready(timeout_s=60, models=["text_embedding"])
    ...     vectors = client.embed(["A quick brown fox.", "Triton serves models."])  # float32 [2, 384]

See docs/client.md.
"""

from fastpath_client.aio import AsyncClient
from fastpath_client.client import Client
from fastpath_client.detection import Detection
from fastpath_client.errors import (
    FastPathClientError,
    InvalidInputError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelRestartingError,
    PermissionDeniedError,
    ProtocolMismatchError,
    RequestTimeoutError,
    ServerBusyError,
    ServerConnectionError,
    ServerError,
    UnavailableError,
    WrongPortError,
)
from fastpath_client.retry import NO_RETRY, RetryPolicy
from fastpath_client.tensors import ModelSpec, TensorSpec

__all__ = [
    "AsyncClient",
    "Client",
    "Detection",
    "FastPathClientError",
    "InvalidInputError",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "ModelRestartingError",
    "ModelSpec",
    "NO_RETRY",
    "PermissionDeniedError",
    "ProtocolMismatchError",
    "RequestTimeoutError",
    "RetryPolicy",
    "ServerBusyError",
    "ServerConnectionError",
    "ServerError",
    "TensorSpec",
    "UnavailableError",
    "WrongPortError",
]
