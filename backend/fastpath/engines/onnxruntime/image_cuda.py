"""An image model on ONNX Runtime's CUDA EP: uint8 batches in, one CUDA graph per (batch, height, width) bucket.

For ``text_detection``'s ``model.uint8.onnx`` (:func:`fastpath.artifacts.detection.uint8_front`): input
uint8 [B, H, W, 3] RGB, normalization inside the graph, output float32 [B, 1, H, W]. A call
(:meth:`OnnxRuntimeCudaImageEngine.run_into`) is one H2D copy of the batch from a page-locked host block, a run
with ``IOBinding`` on fixed device buffers (a graph replay for a shape given to ``capture``, else a graph-free
session), and one D2H copy of the maps; copies are timed with CUDA events (``stats()``). Graphs captured while
serving (``graph_after_runs`` > 0) are off by default: docs/known-issues.md. Every run goes through one worker
thread the engine owns (ONNX Runtime keeps graphs per calling thread), and captures hold
:data:`fastpath.memory.cuda.CAPTURE_LOCK`. Graphs share one session by default (``gpu_graph_id`` per shape);
``session_per_graph`` gives each its own session, so no later shape changes the kernel state or reuses the
arena blocks a captured graph replays into. Design and why: docs/design/text_detection.md#on-a-gpu.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort

from fastpath.engines.base import Engine
from fastpath.engines.onnxruntime.cuda_graphs import (
    CUDA_INTRA_OP_THREADS,
    PROVIDER,
    cuda_allow_spinning,
    cuda_session_options,
    require_cuda_provider,
)
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import EngineError
from fastpath.memory.cuda import CAPTURE_LOCK, cuda_call, enqueue_timed_copy, runtime
from fastpath.profiling import PROFILE

WARM_RUNS_BEFORE_CAPTURE = 3  # the CUDA EP runs a graph id regularly a few times, then captures it
ImageShape = tuple[int, int, int]  # (batch, height, width)
IMAGE_BYTES_PER_PIXEL, MAP_BYTES_PER_PIXEL = 3, 4  # uint8 RGB in, float32 probability out
ENGINE_OWNED_OPTIONS = ("device_id", "use_tf32", "enable_cuda_graph")
# The graph-free session meets new shapes while serving: cuDNN's heuristic picks each convolution's algorithm at
# once, where ONNX Runtime's default (EXHAUSTIVE) benchmarks every algorithm on a shape's first run. Graph sessions
# keep EXHAUSTIVE: their shapes are captured once, at load.
EAGER_DEFAULTS = {"cudnn_conv_algo_search": "HEURISTIC"}


def cuda_provider_options(device_id: int, *, tf32: bool, graphs: bool, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """CUDA EP options of one of the engine's sessions (ONNX Runtime's names, string values).

    The device and ``use_tf32``; a graph session adds ``enable_cuda_graph``, a graph-free one :data:`EAGER_DEFAULTS`;
    ``extra`` goes on top (e.g. ``cudnn_conv_algo_search``, ``arena_extend_strategy``).

    Raises:
        EngineError: ``extra`` sets one of :data:`ENGINE_OWNED_OPTIONS`, or a value that is not a string.
    """
    extra = dict(extra or {})
    for key, value in extra.items():
        if key in ENGINE_OWNED_OPTIONS or not isinstance(value, str):
            raise EngineError(f"CUDA EP option {key}={value!r} cannot be set here: the engine sets "
                              f"{', '.join(ENGINE_OWNED_OPTIONS)} itself, and values are strings")
    options = {"device_id": str(device_id), "use_tf32": "1" if tf32 else "0"}
    options.update({"enable_cuda_graph": "1"} if graphs else EAGER_DEFAULTS)
    return {**options, **extra}


def cuda_session(path: str, provider_options: Mapping[str, str], intra_op_threads: int = CUDA_INTRA_OP_THREADS) -> ort.InferenceSession:
    """A CUDA EP session of ``path`` (``provider_options`` from :func:`cuda_provider_options`): for CUDA graphs
    (``graphs=True``), or a graph-free session of its own for one shape; ``intra_op_threads``: see
    :func:`~fastpath.engines.onnxruntime.cuda_graphs.cuda_session_options`.

    Raises:
        EngineError: the model does not load.
    """
    try:
        return ort.InferenceSession(path, cuda_session_options(intra_op_threads), providers=[(PROVIDER, dict(provider_options))])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise EngineError(f"ONNX Runtime (CUDA EP) could not load {path}: {exc}") from exc


@dataclasses.dataclass
class EngineStats:
    """Cumulative counters of one engine (read with :meth:`OnnxRuntimeCudaImageEngine.stats`).

    Attributes:
        h2d_bytes, h2d_s: bytes copied host-to-device and the copies' seconds (CUDA events around each copy:
            its DMA from page-locked memory; from pageable memory also the thread's wait to issue it).
        d2h_bytes, d2h_s: the same device-to-host.
        d2d_bytes, d2d_s: input copied from device batches (``decode_device cuda``) into the bound input.
        graph_runs: replays of a captured graph; capture_runs: runs that warmed or captured one;
        eager_runs: runs on the graph-free session; graphs: graphs captured.
    """

    h2d_bytes: int = 0
    h2d_s: float = 0.0
    d2h_bytes: int = 0
    d2h_s: float = 0.0
    d2d_bytes: int = 0
    d2d_s: float = 0.0
    graph_runs: int = 0
    capture_runs: int = 0
    eager_runs: int = 0
    graphs: int = 0


class _Binding:
    """Device input and output buffers of one shape, bound to the session that runs it."""

    def __init__(self, session: ort.InferenceSession, shape: ImageShape, input_name: str, output_name: str,
                 device_id: int, graph_id: int | None) -> None:
        batch, height, width = shape
        self.session = session
        self.input = ort.OrtValue.ortvalue_from_shape_and_type([batch, height, width, 3], np.uint8, "cuda", device_id)
        self.output = ort.OrtValue.ortvalue_from_shape_and_type([batch, 1, height, width], np.float32, "cuda", device_id)
        self.binding = session.io_binding()
        self.binding.bind_ortvalue_input(input_name, self.input)
        self.binding.bind_ortvalue_output(output_name, self.output)
        self.run_options = ort.RunOptions()
        if graph_id is not None:
            self.run_options.add_run_config_entry("gpu_graph_id", str(graph_id))
        self.runs = 0


class OnnxRuntimeCudaImageEngine(Engine):
    """uint8 images -> float32 maps on one GPU, CUDA graphs per bucket.

    Args:
        path: the uint8-input ONNX (input uint8 [B, H, W, 3], first output float32 [B, 1, H, W]).
        device_id: CUDA device ordinal (Triton's ``model_instance_device_id`` for KIND_GPU).
        batch_sizes: batch sizes that get graphs (the scheduler's ``batch_buckets``).
        max_graphs, graph_after_runs: most graphs (0: none; other shapes run graph-free); runs of a shape before
            it gets a graph while serving (0: only the shapes given to :meth:`capture`).
        max_eager_shapes: graph-free shapes whose device buffers are kept (least recently used go); intra_op_threads:
            CPU threads of every session (1: the calling thread alone; see ``cuda_session_options``).
        tf32: let cuDNN and cuBLAS use TF32 on float32 (``use_tf32``); False keeps the CPU path's float32 arithmetic.
        eager_options, graph_options: extra CUDA EP options of the graph-free and graph sessions (:func:`cuda_provider_options`).
        session_per_graph: each captured shape gets a session of its own, not one shared under ``gpu_graph_id``.
        eager_session_per_shape: a graph-free batch runs one image per call on a session of its (height, width)
            alone (``max_eager_shapes`` kept): one shared session rebuilds its cuDNN plans at every change of
            input shape (0.1-0.6 s per call on the H200: docs/benchmarks/detection_engine_h200.md).

    Raises:
        EngineError: no CUDA EP, the model does not load or has other tensors, or an option the engine sets is given.
    """

    name = "onnxruntime-cuda-image"

    def __init__(self, path: str, *, device_id: int = 0, batch_sizes: Sequence[int] = (1, 2, 4, 8), max_graphs: int = 64,
                 graph_after_runs: int = 0, max_eager_shapes: int = 16, tf32: bool = False,
                 eager_options: Mapping[str, str] | None = None, graph_options: Mapping[str, str] | None = None,
                 session_per_graph: bool = False, eager_session_per_shape: bool = False,
                 intra_op_threads: int = CUDA_INTRA_OP_THREADS) -> None:
        require_cuda_provider()
        self.path = path
        self.device_id = device_id
        self.batch_sizes = frozenset(batch_sizes)
        self.max_graphs = max_graphs
        self.graph_after_runs = graph_after_runs
        self.max_eager_shapes = max_eager_shapes
        self.session_per_graph = session_per_graph
        self.eager_session_per_shape = eager_session_per_shape
        self.intra_op_threads = intra_op_threads
        self._graph_options = cuda_provider_options(device_id, tf32=tf32, graphs=True, extra=graph_options)
        eager = cuda_provider_options(device_id, tf32=tf32, graphs=False, extra=eager_options)
        self._eager_options = eager
        self._eager = OnnxRuntimeEngine(path, providers=((PROVIDER, eager),), intra_op_threads=intra_op_threads,
                                        allow_spinning=cuda_allow_spinning(intra_op_threads))
        self._inputs, self._outputs = self._eager.inputs, self._eager.outputs
        spec = self._inputs[0]
        if len(self._inputs) != 1 or spec.dtype != np.uint8 or len(spec.shape) != 4 or spec.shape[3] != 3:
            raise EngineError(f"{path}: expected one uint8 input [batch, height, width, 3] (model.uint8.onnx); "
                              f"got {[(s.name, s.dtype.name, list(s.shape)) for s in self._inputs]}")
        shared = max_graphs and not session_per_graph
        self._graph_session = cuda_session(path, self._graph_options, intra_op_threads) if shared else None
        self._graphs: dict[ImageShape, _Binding] = {}
        self._eager_bindings: dict[ImageShape, _Binding] = {}
        self._seen: dict[ImageShape, int] = {}  # runs per shape without a graph (bounded: cleared past 4096 shapes)
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="onnxruntime-cuda")  # the one thread that runs sessions
        self._stats = EngineStats()
        self._stats_lock = threading.Lock()  # not _lock, held for a whole run: a reader of the counters never waits on one
        cudart = runtime()
        cuda_call(cudart.cudaSetDevice(device_id), "cudaSetDevice")
        self._stream = cuda_call(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self._events = [cuda_call(cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(2)]

    @property
    def graph_shapes(self) -> tuple[ImageShape, ...]:
        """(batch, height, width) of every bucket with a graph, captured or being captured."""
        return tuple(self._graphs)

    def stats(self) -> EngineStats:
        """A copy of the counters (without waiting for a run in progress)."""
        with self._stats_lock:
            return dataclasses.replace(self._stats)

    def _binding(self, shape: ImageShape, force_graph: bool = False) -> tuple[_Binding, str]:
        """The binding of ``shape`` and its kind (``graph`` | ``capture`` | ``eager``); makes it on first use."""
        binding = self._graphs.get(shape)
        if binding is None and self.max_graphs and len(self._graphs) < self.max_graphs and shape[0] in self.batch_sizes \
                and (force_graph or 0 < self.graph_after_runs <= self._seen.get(shape, 0)):
            session = cuda_session(self.path, self._graph_options, self.intra_op_threads) if self.session_per_graph else self._graph_session
            binding = _Binding(session, shape, self._inputs[0].name, self._outputs[0].name, self.device_id,
                               graph_id=len(self._graphs) + 1)
            self._graphs[shape] = binding
            self._eager_bindings.pop(shape, None)
        if binding is not None:
            return binding, "graph" if binding.runs >= WARM_RUNS_BEFORE_CAPTURE else "capture"
        if len(self._seen) >= 4096:
            self._seen.clear()
        self._seen[shape] = self._seen.get(shape, 0) + 1
        binding = self._eager_bindings.pop(shape, None)
        if binding is None:
            session = cuda_session(self.path, self._eager_options, self.intra_op_threads) if self.eager_session_per_shape else self._eager._session
            binding = _Binding(session, shape, self._inputs[0].name, self._outputs[0].name, self.device_id, None)
            if len(self._eager_bindings) >= self.max_eager_shapes:
                self._eager_bindings.pop(next(iter(self._eager_bindings)))
        self._eager_bindings[shape] = binding  # most recently used last
        return binding, "eager"

    def run_into(self, images: np.ndarray, maps: np.ndarray, *, force_graph: bool = False) -> str:
        """Run one batch on the engine's worker thread: ``images`` uint8 [B, H, W, 3] (host) -> ``maps``
        float32 [B, H, W] (host, written).

        Both should be page-locked (staging-pool blocks) for DMA-speed copies; pageable memory
        works, slower. ``force_graph``: give the shape a graph now (warm-up). Returns how it ran:
        ``graph`` (replay), ``capture`` or ``eager``.

        Raises:
            EngineError: wrong dtypes or shapes, a closed engine, or an ONNX Runtime failure.
            CudaError: a copy failed.
        """
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3 or not images.flags.c_contiguous:
            raise EngineError(f"images must be C-contiguous uint8 [B, H, W, 3]; got {images.dtype}{list(images.shape)}")
        return self._worker.submit(self._run_into, images.ctypes.data, images.shape[:3], maps, False, force_graph).result()

    def run_device_into(self, data_ptr: int, shape: ImageShape, maps: np.ndarray) -> str:
        """As :meth:`run_into` for a batch already on this engine's GPU: uint8 [B, H, W, 3] at ``data_ptr``
        (contiguous, its producer's work finished), copied device to device into the bound input."""
        return self._worker.submit(self._run_into, data_ptr, tuple(shape), maps, True, False).result()

    def _run_into(self, source_ptr: int, shape: ImageShape, maps: np.ndarray, on_device: bool, force_graph: bool) -> str:
        """One batch of ``shape`` (batch, height, width) from ``source_ptr`` (host or device): copy in, run, copy the maps out."""
        if maps.dtype != np.float32 or maps.shape != tuple(shape) or not maps.flags.c_contiguous:
            raise EngineError(f"maps must be C-contiguous float32 {list(shape)}; got {maps.dtype}{list(maps.shape)}")
        with self._lock:
            if self._eager._session is None:
                raise EngineError("ONNX Runtime CUDA image engine is closed")
            cuda_call(runtime().cudaSetDevice(self.device_id), "cudaSetDevice")  # the runtime's device is per thread
            batch, height, width = shape
            split = self.eager_session_per_shape and batch > 1 and not force_graph and tuple(shape) not in self._graphs
            if not split:
                return self._run_one(source_ptr, tuple(shape), maps.ctypes.data, on_device, force_graph)
            pixels = height * width  # one image per call: see eager_session_per_shape
            for row in range(batch):
                kind = self._run_one(source_ptr + row * pixels * IMAGE_BYTES_PER_PIXEL, (1, height, width),
                                     maps.ctypes.data + row * pixels * MAP_BYTES_PER_PIXEL, on_device, False)
        return kind

    def _run_one(self, source_ptr: int, shape: ImageShape, maps_ptr: int, on_device: bool, force_graph: bool) -> str:
        """One engine run of ``shape``: copy its input in from ``source_ptr``, run, copy its maps out to ``maps_ptr``
        (host, float32 [B, H, W]). Caller holds ``_lock``."""
        cudart = runtime()
        pixels = int(np.prod(shape))
        nbytes, map_bytes = pixels * IMAGE_BYTES_PER_PIXEL, pixels * MAP_BYTES_PER_PIXEL
        with CAPTURE_LOCK:  # a new shape's buffers are cudaMalloc'ed
            binding, kind = self._binding(shape, force_graph)
        copy_kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice if on_device else cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        mark = PROFILE.start()  # each step waits for its device work: its host span is its device time
        seconds = self._copy(binding.input.data_ptr(), source_ptr, nbytes, copy_kind)
        mark = PROFILE.lap("gpu.d2d" if on_device else "gpu.h2d", mark, shape[0])
        self._execute(binding, kind)
        mark = PROFILE.lap(f"gpu.{kind}", mark, shape[0])
        d2h_s = self._copy(maps_ptr, binding.output.data_ptr(), map_bytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        PROFILE.lap("gpu.d2h", mark, shape[0])
        with self._stats_lock:
            if on_device:
                self._stats.d2d_bytes += nbytes
                self._stats.d2d_s += seconds
            else:
                self._stats.h2d_bytes += nbytes
                self._stats.h2d_s += seconds
            self._stats.d2h_bytes += map_bytes
            self._stats.d2h_s += d2h_s
        return kind

    def run_resident(self, shape: ImageShape) -> str:
        """Run ``shape`` (batch, height, width) on its bound device buffers, without copies: the device work of a
        call alone, for benchmarks. The input is what the shape's last call left there (uninitialized bytes for a
        new shape). Returns how it ran (as :meth:`run_into`).

        Raises:
            EngineError: a closed engine or an ONNX Runtime failure.
        """
        return self._worker.submit(self._run_resident, tuple(shape)).result()

    def _run_resident(self, shape: ImageShape) -> str:
        with self._lock:
            if self._eager._session is None:
                raise EngineError("ONNX Runtime CUDA image engine is closed")
            cuda_call(runtime().cudaSetDevice(self.device_id), "cudaSetDevice")
            with CAPTURE_LOCK:
                binding, kind = self._binding(shape)
            self._execute(binding, kind)
        return kind

    def _execute(self, binding: _Binding, kind: str) -> None:
        """One run of ``binding`` on its session (a capture holds CAPTURE_LOCK); counts it. Caller holds ``_lock``."""
        try:
            if kind == "capture":
                with CAPTURE_LOCK:
                    binding.session.run_with_iobinding(binding.binding, binding.run_options)
            else:
                binding.session.run_with_iobinding(binding.binding, binding.run_options)
        except Exception as exc:
            shape = list(binding.input.shape())
            raise EngineError(f"ONNX Runtime CUDA run failed for images {shape} ({kind}): {exc}") from exc
        binding.runs += 1
        with self._stats_lock:
            if kind == "capture" and binding.runs == WARM_RUNS_BEFORE_CAPTURE:
                self._stats.graphs += 1
            setattr(self._stats, f"{kind}_runs", getattr(self._stats, f"{kind}_runs") + 1)

    def _copy(self, dst: int, src: int, nbytes: int, kind: object) -> float:
        """One async copy on the engine's stream between two CUDA events; waits for it; returns its seconds.

        From page-locked memory (staging blocks) the three calls are issued without giving up the GIL
        (:func:`~fastpath.memory.cuda.enqueue_timed_copy`), so the events time the DMA alone. From pageable
        memory they go through cuda-python, which releases the GIL around each call: the idle stream stamps
        the first event at once, and the seconds then also hold this thread's wait for the GIL."""
        cudart = runtime()
        start, end = self._events
        if not enqueue_timed_copy(start, end, dst, src, nbytes, self._stream):
            cuda_call(cudart.cudaEventRecord(start, self._stream), "cudaEventRecord")
            cuda_call(cudart.cudaMemcpyAsync(dst, src, nbytes, kind, self._stream), "cudaMemcpyAsync")
            cuda_call(cudart.cudaEventRecord(end, self._stream), "cudaEventRecord")
        cuda_call(cudart.cudaEventSynchronize(end), "cudaEventSynchronize")
        return cuda_call(cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime") * 1e-3

    def capture(self, shapes: Sequence[ImageShape]) -> int:
        """Warm and capture the graphs of ``shapes`` (batch, height, width) on white images; returns graphs made."""
        before = len(self._graphs)
        for batch, height, width in shapes:
            images = np.full((batch, height, width, 3), 255, np.uint8)
            maps = np.empty((batch, height, width), np.float32)
            for _ in range(WARM_RUNS_BEFORE_CAPTURE + 1):
                self.run_into(images, maps, force_graph=True)
        return len(self._graphs) - before

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The :class:`Engine` interface: uint8 [B, H, W, 3] -> {output: float32 [B, 1, H, W]} (new arrays)."""
        images = np.ascontiguousarray(feeds[self._inputs[0].name])
        maps = np.empty(images.shape[:3], np.float32)
        self.run_into(images, maps)
        return {self._outputs[0].name: maps[:, None]}

    @property
    def closed(self) -> bool:
        return self._eager.closed

    def close(self) -> None:
        """Release sessions, buffers, stream and events (idempotent)."""
        with self._lock:
            if self._eager._session is None:
                return
            self._graphs.clear()
            self._eager_bindings.clear()
            self._graph_session = None
            self._eager.close()
            cudart = runtime()
            for event in self._events:
                cudart.cudaEventDestroy(event)
            cudart.cudaStreamDestroy(self._stream)
        self._worker.shutdown(wait=True)

