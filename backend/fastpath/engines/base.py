"""The engine interface every runtime implements."""

from __future__ import annotations

import abc
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of an engine input or output.

    Attributes:
        name: tensor name in the artifact (e.g. ONNX graph input name).
        dtype: numpy dtype.
        shape: dimensions; ``-1`` marks a dynamic dimension.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


class Engine(abc.ABC):
    """A loaded model that runs whole batches.

    Owners call :meth:`close` (or use the engine as a context manager) to release it; ``close`` is
    idempotent. ``infer`` may be called from a worker thread; runtimes release the GIL while running.
    """

    name: str = "engine"

    @property
    @abc.abstractmethod
    def inputs(self) -> tuple[TensorSpec, ...]:
        """Input tensor specs of the artifact."""

    @property
    @abc.abstractmethod
    def outputs(self) -> tuple[TensorSpec, ...]:
        """Output tensor specs of the artifact."""

    @abc.abstractmethod
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch.

        Args:
            feeds: input name -> array, batch dimension first.

        Returns:
            Output name -> array, batch dimension first, same batch size as the inputs.

        Raises:
            fastpath.errors.EngineError: the runtime failed on this batch.
        """

    def close(self) -> None:
        """Release the engine's resources (idempotent)."""

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
