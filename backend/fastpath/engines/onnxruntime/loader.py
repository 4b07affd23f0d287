"""The onnxruntime runtime's loader: picks its engine by device and input layout.

- ``device="cpu"``: :class:`~fastpath.engines.onnxruntime.engine.OnnxRuntimeEngine` (CPU execution
  provider; any model).
- ``device="cuda[:N]"``, ``layout="tokens"``: :class:`~fastpath.engines.onnxruntime.cuda_graphs.OnnxRuntimeCudaGraphEngine`
  (int64 [B, L] inputs, one CUDA graph per (batch, length) bucket).
- ``device="cuda[:N]"``, ``layout="images"``: :class:`~fastpath.engines.onnxruntime.image_cuda.OnnxRuntimeCudaImageEngine`
  (uint8 [B, H, W, 3] in, one CUDA graph per captured (batch, height, width); text_detection's GPU path).

The CUDA modules are imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastpath.engines.base import Engine
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import ConfigError

LAYOUTS = ("tokens", "images")
TOKEN_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
IMAGE_BATCH_SIZES = (1, 2, 4, 8)


def load(
    path: str,
    *,
    device: str = "cpu",
    layout: str = "tokens",
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    lanes: int = 0,
    lane_threads: int = 1,
    memory_pattern: bool = True,
    arena_max_input_bytes: int | None = None,
    batch_sizes: tuple[int, ...] | None = None,
    lengths: tuple[int, ...] = (16, 32, 64, 128, 256),
    check_addresses: bool = False,
    max_graphs: int = 64,
    graph_after_runs: int = 0,
    max_eager_shapes: int = 16,
    tf32: bool = False,
    eager_options: Mapping[str, str] | None = None,
    graph_options: Mapping[str, str] | None = None,
    session_per_graph: bool = False,
    eager_session_per_shape: bool = False,
    cuda_intra_op_threads: int = 1,
) -> Engine:
    """Registry entry point (``load_engine("onnxruntime", path, ...)``).

    Args:
        path: the ``.onnx`` file (fp32 or INT8 QDQ; ``model.uint8.onnx`` for ``layout="images"``).
        device: ``"cpu"`` (CPU EP) or ``"cuda"`` / ``"cuda:N"`` (CUDA EP with CUDA graphs; needs onnxruntime-gpu).
        layout: CUDA only: ``"tokens"`` (int64 [B, L] inputs, (batch, length) buckets) or ``"images"``
            (uint8 [B, H, W, 3] input, graphs per (batch, height, width)).
        intra_op_threads, allow_spinning, lanes, lane_threads, memory_pattern, arena_max_input_bytes:
            CPU only: see :class:`OnnxRuntimeEngine` (0 threads: one per CPU the process may use).
        batch_sizes: CUDA only: batch sizes that get graphs; None: ``TOKEN_BATCH_SIZES`` or ``IMAGE_BATCH_SIZES``.
        lengths, check_addresses: ``tokens``: the length buckets in tokens; verify bound buffers never
            move between capture and replay.
        max_graphs, graph_after_runs, max_eager_shapes, tf32, eager_options, graph_options, session_per_graph,
            eager_session_per_shape: ``images`` only (see OnnxRuntimeCudaImageEngine).
        cuda_intra_op_threads: CUDA only: CPU threads of each CUDA EP session (``cuda_graphs.cuda_session_options``).

    Raises:
        ConfigError: an unknown device or layout.
        EngineError: the model does not load, or CUDA was asked for without onnxruntime-gpu.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"onnxruntime layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if device == "cpu":
        return OnnxRuntimeEngine(path, intra_op_threads=intra_op_threads, allow_spinning=allow_spinning, lanes=lanes,
                                 lane_threads=lane_threads, memory_pattern=memory_pattern,
                                 arena_max_input_bytes=arena_max_input_bytes)
    if not device.startswith("cuda"):
        raise ConfigError(f"onnxruntime device {device!r} is not 'cpu' or 'cuda[:N]'")
    device_id = int(device.partition(":")[2] or 0)
    if layout == "images":
        from fastpath.engines.onnxruntime.image_cuda import OnnxRuntimeCudaImageEngine

        return OnnxRuntimeCudaImageEngine(path, device_id=device_id, batch_sizes=IMAGE_BATCH_SIZES if batch_sizes is None else batch_sizes,
                                          max_graphs=max_graphs, graph_after_runs=graph_after_runs,
                                          max_eager_shapes=max_eager_shapes, tf32=tf32, eager_options=eager_options,
                                          graph_options=graph_options, session_per_graph=session_per_graph,
                                          eager_session_per_shape=eager_session_per_shape, intra_op_threads=cuda_intra_op_threads)
    from fastpath.engines.onnxruntime.cuda_graphs import OnnxRuntimeCudaGraphEngine

    return OnnxRuntimeCudaGraphEngine(path, batch_sizes=TOKEN_BATCH_SIZES if batch_sizes is None else batch_sizes, lengths=lengths,
                                      device_id=device_id, check_addresses=check_addresses, intra_op_threads=cuda_intra_op_threads)
