"""ONNX Runtime engine (CPU execution provider by default).

ONNX Runtime releases the GIL inside ``InferenceSession.run``, so a worker thread can run a batch
while the Python thread that feeds it tokenizes the next one.

Memory (docs/design/text_detection.md, "Memory"): by default a session allocates from ONNX Runtime's
CPU memory arena, which keeps every byte it ever grew to for the next call. With
``arena_max_input_bytes`` set, calls whose inputs are larger run in another ``InferenceSession`` of
the same model, built without the arena, so their working memory goes back to the C allocator when
the call ends.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort

from fastpath.engines.base import Engine, TensorSpec
from fastpath.engines.cpus import ort_intra_op_threads
from fastpath.errors import EngineError

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
}


def _spec(node: ort.NodeArg) -> TensorSpec:
    shape = tuple(dim if isinstance(dim, int) else -1 for dim in node.shape)
    return TensorSpec(node.name, np.dtype(_ORT_TYPES.get(node.type, np.float32)), shape)


class OnnxRuntimeEngine(Engine):
    """An ONNX model in an ONNX Runtime ``InferenceSession``.

    Args:
        path: the ``.onnx`` file.
        intra_op_threads: threads per operator; 0: one per CPU the process may use (:mod:`fastpath.engines.cpus`).
        providers: execution providers in priority order (default: CPU only).
        allow_spinning: ``session.intra_op.allow_spinning`` of the main session (threads busy-wait between operators).
        lanes, lane_threads: extra sessions for :meth:`infer_lane` (0: none), each with its own copy of
            the weights and ``lane_threads`` (>= 1) intra-op threads.
        memory_pattern: ONNX Runtime's ``enable_mem_pattern`` for the arena sessions (main and lanes).
        arena_max_input_bytes: None: every call runs in the arena session; otherwise a call with more input
            bytes runs in a session without the CPU arena, which frees its working memory when it returns
            (why: docs/design/text_detection.md#memory).

    Attributes:
        calls_without_arena: calls run in the session without the arena so far.

    Raises:
        EngineError: a missing or unloadable file, ``lanes`` < 0, ``lane_threads`` < 1 or ``arena_max_input_bytes`` < 0.
    """

    name = "onnxruntime"

    def __init__(self, path: str, *, intra_op_threads: int = 0, providers: tuple[str | tuple[str, dict], ...] = ("CPUExecutionProvider",),
                 allow_spinning: bool = True, lanes: int = 0, lane_threads: int = 1, memory_pattern: bool = True,
                 arena_max_input_bytes: int | None = None) -> None:
        if lanes < 0 or lane_threads < 1:
            raise EngineError(f"ONNX Runtime engine lanes must be >= 0 with >= 1 thread each, got {lanes} x {lane_threads}")
        if arena_max_input_bytes is not None and arena_max_input_bytes < 0:
            raise EngineError(f"ONNX Runtime engine arena_max_input_bytes must be >= 0 (or None), got {arena_max_input_bytes}")
        arena = _Memory(arena=True, pattern=memory_pattern)
        self._session: ort.InferenceSession | None = _session(path, providers, intra_op_threads, allow_spinning, arena)
        # With one intra-op thread the calling thread does all the work: no worker spins and no operator
        # waits at a barrier for a thread the OS gave to another process (docs/design/scheduler.md).
        self._lane_sessions = [_session(path, providers, lane_threads, allow_spinning and lane_threads > 1, arena)
                               for _ in range(lanes)]
        self.arena_max_input_bytes = arena_max_input_bytes
        self._unpooled = (None if arena_max_input_bytes is None else
                          _session(path, providers, intra_op_threads, allow_spinning, _Memory(arena=False, pattern=True)))
        self.calls_without_arena = 0
        self.lanes = lanes
        self._inputs = tuple(_spec(n) for n in self._session.get_inputs())
        self._outputs = tuple(_spec(n) for n in self._session.get_outputs())
        self._wanted = frozenset(spec.name for spec in self._inputs)

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._unpooled is not None and sum(value.nbytes for value in feeds.values()) > self.arena_max_input_bytes:
            self.calls_without_arena += 1
            return self._run(self._unpooled, feeds)
        return self._run(self._session, feeds)

    def _infer_lane(self, feeds: dict[str, np.ndarray], lane: int) -> dict[str, np.ndarray]:
        return self._run(self._lane_sessions[lane] if lane < len(self._lane_sessions) else None, feeds)

    def _run(self, session: ort.InferenceSession | None, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if session is None or self._session is None:
            raise EngineError("ONNX Runtime engine is closed")
        try:
            results = session.run(None, {k: v for k, v in feeds.items() if k in self._wanted})
        except Exception as exc:
            raise EngineError(f"ONNX Runtime failed on a batch of shape {next(iter(feeds.values())).shape}: {exc}") from exc
        return {spec.name: value for spec, value in zip(self._outputs, results)}

    @property
    def closed(self) -> bool:
        return self._session is None

    def close(self) -> None:
        self._session = None
        self._lane_sessions = []
        self._unpooled = None


@dataclasses.dataclass(frozen=True)
class _Memory:
    """A session's allocation options: ONNX Runtime's ``enable_cpu_mem_arena`` and ``enable_mem_pattern``."""

    arena: bool
    pattern: bool


def session_options(intra_op_threads: int, allow_spinning: bool) -> ort.SessionOptions:
    """``SessionOptions`` every FastPath session shares: all graph optimizations, ``intra_op_threads`` (0: one per CPU
    the process may use, :func:`~fastpath.engines.cpus.ort_intra_op_threads`) and ``session.intra_op.allow_spinning``.

    Raises:
        ValueError: ``intra_op_threads`` < 0.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = ort_intra_op_threads(intra_op_threads)
    # ONNX Runtime's documented session option: worker threads busy-wait for the next operator
    # ("1", its default) or sleep ("0"), which leaves the cores to Triton, clients and tokenization.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def _session(path: str, providers: tuple[str | tuple[str, dict], ...], intra_op_threads: int,
             allow_spinning: bool, memory: _Memory) -> ort.InferenceSession:
    """An ``InferenceSession`` with FastPath's options; raises EngineError when the model does not load."""
    options = session_options(intra_op_threads, allow_spinning)
    options.enable_cpu_mem_arena = memory.arena
    options.enable_mem_pattern = memory.pattern
    options.inter_op_num_threads = 1
    try:
        # Common-subexpression elimination merges the INT8 model's per-consumer Q/DQ pairs back into
        # shared ones, and ONNX Runtime then cannot fuse DQ -> MatMul for Q, K and V (INT8 1x32: 28.2 ms
        # with it, 12.1 ms without; fp32 and the detector unchanged within noise: docs/design/engines.md)
        return ort.InferenceSession(path, options, providers=list(providers),
                                    disabled_optimizers=["CommonSubexpressionElimination"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/NoSuchFile types
        raise EngineError(f"ONNX Runtime could not load {path}: {exc}") from exc
