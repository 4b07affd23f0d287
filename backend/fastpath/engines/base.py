"""The engine interface every runtime implements."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping

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

    The life cycle follows Polygraphy's runners: load (a runtime's ``loader.load``), :meth:`warmup`
    (capture CUDA graphs, build profiles), :meth:`infer` on batches, :meth:`close`. Owners call
    :meth:`close` (or use the engine as a context manager) to release it; ``close`` is idempotent.
    ``infer`` may be called from a worker thread; runtimes release the GIL while running.

    :meth:`infer` and :meth:`infer_lane` are the public calls, and the one place feeds and results
    are checked (:func:`check_feeds`, :func:`check_outputs`); a runtime implements :meth:`_infer`
    (and :meth:`_infer_lane` when it has lanes), as Polygraphy's ``infer`` delegates to ``infer_impl``.
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

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch.

        Args:
            feeds: input name -> array, batch dimension first, every input of :attr:`inputs` present
                with the same batch size; feeds the engine does not take are ignored.

        Returns:
            Output name -> array, batch dimension first, same batch size as the inputs.

        Raises:
            fastpath.errors.EngineError: the engine is closed, a feed is missing or has no batch
                dimension, the batch sizes differ, the runtime failed on this batch, or it returned
                another batch size.
        """
        batch = check_feeds(self, feeds)
        return check_outputs(self, self._infer(feeds), batch)

    @abc.abstractmethod
    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch whose feeds :meth:`infer` has checked; same contract as :meth:`infer`."""

    lanes: int = 0  # independent single-batch copies for infer_lane (0: none)

    def infer_lane(self, feeds: dict[str, np.ndarray], lane: int) -> dict[str, np.ndarray]:
        """Run one batch on lane ``lane`` (0 <= lane < ``lanes``): a copy of the engine that runs
        beside the other lanes (ONNX Runtime: one single-threaded session each). Same contract as
        :meth:`infer`.

        Raises:
            fastpath.errors.EngineError: the engine has no such lane, or as :meth:`infer`.
        """
        if not 0 <= lane < self.lanes:
            raise EngineError(f"{self.name} engine has {self.lanes} lanes; lane {lane} does not exist")
        batch = check_feeds(self, feeds)
        return check_outputs(self, self._infer_lane(feeds, lane), batch)

    def _infer_lane(self, feeds: dict[str, np.ndarray], lane: int) -> dict[str, np.ndarray]:
        """Run one checked batch on an existing lane; runtimes with ``lanes`` > 0 override it."""
        raise EngineError(f"{self.name} engine declares {self.lanes} lanes but runs none")

    @property
    def buckets(self) -> tuple:
        """Shapes the engine has prepared (captured CUDA graphs, optimization profiles).

        Returns:
            :class:`fastpath.graphs.Bucket` tuples, largest first; empty when any shape runs
            the same way (e.g. ONNX Runtime on the CPU).
        """
        return ()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has released the engine (runtimes that hold resources override it)."""
        return False

    def warmup(self) -> None:
        """Prepare the engine before the first request (capture graphs, allocate); default: nothing."""

    def close(self) -> None:
        """Release the engine's resources (idempotent)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_feeds(engine: Engine, feeds: Mapping[str, np.ndarray]) -> int:
    """The batch size of ``feeds`` for ``engine``, after checking them.

    Checked: the engine is open, every input of ``engine.inputs`` is present (all feeds when the engine
    declares none), each is an array with a batch dimension first, and all have the same batch size.

    Returns:
        The batch size (rows), or -1 when nothing was fed to an engine that declares no inputs.

    Raises:
        EngineError: naming the engine, the tensor, what it got and what was expected.
    """
    if engine.closed:
        raise EngineError(f"{engine.name} engine is closed; load the artifact again to run it")
    names = [spec.name for spec in engine.inputs] or sorted(feeds)
    first = ""
    batch = -1
    for name in names:
        value = feeds.get(name)
        if value is None:
            raise EngineError(f"{engine.name} engine: input {name!r} is missing; got {sorted(feeds)}, "
                              f"expected {names}")
        shape = getattr(value, "shape", None)
        if not shape:
            got = f"an array of shape {shape}" if shape is not None else f"a {type(value).__name__}"
            raise EngineError(f"{engine.name} engine: input {name!r} is {got}; expected an array with the "
                              "batch dimension first ([batch, ...])")
        if batch < 0:
            first, batch = name, int(shape[0])
        elif shape[0] != batch:
            raise EngineError(f"{engine.name} engine: input {name!r} has batch size {shape[0]}, input {first!r} has "
                              f"{batch}; expected every input with the same batch size")
    return batch


def check_outputs(engine: Engine, outputs: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """``outputs``, after checking each keeps the batch size of the inputs (``batch`` rows).

    Raises:
        EngineError: an output without a batch dimension or with another batch size, named with both sizes.
    """
    if batch < 0:
        return outputs
    for name, value in outputs.items():
        shape = getattr(value, "shape", None)
        if not shape or shape[0] != batch:
            got = f"an array of shape {shape}" if shape is not None else f"a {type(value).__name__}"
            raise EngineError(f"{engine.name} engine returned output {name!r} as {got} for a batch of {batch}; "
                              f"expected {batch} rows first (the batch size is not preserved)")
    return outputs
