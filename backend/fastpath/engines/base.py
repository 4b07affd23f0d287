"""The engine interface every runtime implements."""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from fastpath.errors import EngineError


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

    The life cycle follows Polygraphy's runners: load (the constructor), :meth:`warmup` (capture
    CUDA graphs, build profiles), :meth:`infer` on batches, :meth:`close`. Owners call
    :meth:`close` (or use the engine as a context manager) to release it; ``close`` is
    idempotent. ``infer`` may be called from a worker thread; runtimes release the GIL while running.
    """

    name: str = "engine"
    _inputs: tuple[TensorSpec, ...] = ()
    _outputs: tuple[TensorSpec, ...] = ()

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """Input tensor specs of the artifact (runtimes set ``_inputs`` when they load, or override)."""
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """Output tensor specs of the artifact (runtimes set ``_outputs`` when they load, or override)."""
        return self._outputs

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

    lanes: int = 0  # independent single-batch copies for infer_lane (0: none)

    def infer_lane(self, feeds: dict[str, np.ndarray], lane: int) -> dict[str, np.ndarray]:
        """Run one batch on lane ``lane`` (0 <= lane < ``lanes``): a copy of the engine that runs
        beside the other lanes (ONNX Runtime: one single-threaded session each). Same contract as
        :meth:`infer`.

        Raises:
            fastpath.errors.EngineError: the runtime failed, or the engine has no such lane.
        """
        raise EngineError(f"{self.name} engine has {self.lanes} lanes; lane {lane} does not exist")

    @property
    def buckets(self) -> tuple:
        """Shapes the engine has prepared (captured CUDA graphs, optimization profiles).

        Returns:
            :class:`fastpath.graphs.Bucket` tuples, largest first; empty when any shape runs
            the same way (e.g. ONNX Runtime on the CPU).
        """
        return ()

    def warmup(self) -> None:
        """Prepare the engine before the first request (capture graphs, allocate); default: nothing."""

    def close(self) -> None:
        """Release the engine's resources (idempotent)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
