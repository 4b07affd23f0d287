"""Choose an ONNX Runtime engine by device: :class:`OnnxRuntimeEngine` on the CPU, or
:class:`OnnxRuntimeCudaGraphEngine` (CUDA execution provider, one CUDA graph per bucket) on a GPU."""

from __future__ import annotations

from fastpath.engines.base import Engine
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import ConfigError


def load(
    path: str,
    *,
    device: str = "cpu",
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    lanes: int = 0,
    lane_threads: int = 1,
    memory_pattern: bool = True,
    arena_max_input_bytes: int | None = None,
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
    lengths: tuple[int, ...] = (16, 32, 64, 128, 256),
    check_addresses: bool = False,
) -> Engine:
    """Registry entry point (``load_engine("onnxruntime", path, ...)``).

    Args:
        path: the ``.onnx`` file (fp32 or INT8 QDQ).
        device: ``"cpu"`` (CPU execution provider) or ``"cuda"`` / ``"cuda:N"`` (CUDA execution
            provider with one CUDA graph per bucket; needs onnxruntime-gpu).
        intra_op_threads: CPU threads per operator (CPU only); 0: one per CPU the process may use.
        allow_spinning: CPU only: ONNX Runtime's ``session.intra_op.allow_spinning`` (worker threads
            busy-wait between operators when True, ONNX Runtime's default).
        lanes, lane_threads: CPU only: extra sessions for ``infer_lane`` (see OnnxRuntimeEngine).
        memory_pattern, arena_max_input_bytes: CPU only: ONNX Runtime's memory pattern, and the input size
            above which a call runs without the CPU memory arena (see OnnxRuntimeEngine).
        batch_sizes, lengths: the CUDA graph buckets (CUDA only).
        check_addresses: verify bound buffers never move between capture and replay (CUDA only).

    Raises:
        ConfigError: an unknown device.
        EngineError: the model does not load, or CUDA was asked for without onnxruntime-gpu.
    """
    if device == "cpu":
        return OnnxRuntimeEngine(path, intra_op_threads=intra_op_threads, allow_spinning=allow_spinning, lanes=lanes,
                                 lane_threads=lane_threads, memory_pattern=memory_pattern,
                                 arena_max_input_bytes=arena_max_input_bytes)
    if device.startswith("cuda"):
        from fastpath.engines.onnxruntime.cuda_graphs import OnnxRuntimeCudaGraphEngine

        device_id = int(device.partition(":")[2] or 0)
        return OnnxRuntimeCudaGraphEngine(path, batch_sizes=batch_sizes, lengths=lengths, device_id=device_id, check_addresses=check_addresses)
    raise ConfigError(f"onnxruntime device {device!r} is not 'cpu' or 'cuda[:N]'")
