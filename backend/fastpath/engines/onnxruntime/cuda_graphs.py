"""ONNX Runtime on the CUDA execution provider with one CUDA graph per bucket.

Needs ``onnxruntime-gpu`` (the GPU machine here has the CPU-only wheel, so this module is written
to ONNX Runtime's "CUDA Execution Provider: Using CUDA Graphs" documentation and tested only for
what needs no GPU). The mechanism is the shared one (:mod:`fastpath.graphs`):

- ``enable_cuda_graph=1`` on the provider; each bucket gets its own graph through the run option
  ``gpu_graph_id`` (ids 1..N; ``-1`` would skip capture);
- inputs and outputs are bound once per bucket with ``IOBinding`` to ``OrtValue`` buffers on the
  GPU, so their addresses never change between capture and replay; ONNX Runtime's Python API
  offers no copy into a sub-range of a device buffer, so each bucket owns exact-size buffers
  instead of slices of one maximum buffer;
- rows are staged on the host with padding and valid filler rows (:func:`fastpath.graphs.stage_rows`)
  and copied in with ``OrtValue.update_inplace``; only the real rows come back;
- shapes without a bucket run in a second, graph-free CUDA session.

Known limit (ONNX Runtime docs): graph capture needs every node on the CUDA EP; a model whose
shape computations are placed on the CPU is refused by ONNX Runtime at the first run, and the
error is raised as :class:`~fastpath.errors.EngineError`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from fastpath.engines.base import Engine, TensorSpec
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine, session_options
from fastpath.errors import EngineError
from fastpath.graphs import BERT_INPUTS, Bucket, BucketGrid, PaddedInput, batch_shape, filler_rows, stage_rows

PROVIDER = "CUDAExecutionProvider"
# A CUDA EP session's CPU thread pool runs only the nodes ONNX Runtime keeps on the CPU (shape arithmetic). At its
# default size, one worker per core, its workers spin after every run although the model computes on the GPU
# (spinPause in the intra-op pool of a GPU-only session: microsoft/onnxruntime#26847), on the cores that the stub's
# decode, post-processing and Python need. One thread is the calling thread alone: no workers, nothing spins.
CUDA_INTRA_OP_THREADS = 1


def cuda_allow_spinning(intra_op_threads: int) -> bool:
    """ONNX Runtime's default spinning where a CUDA EP session has pool workers to spin; none with one thread."""
    return intra_op_threads != 1


def cuda_session_options(intra_op_threads: int = CUDA_INTRA_OP_THREADS) -> ort.SessionOptions:
    """``SessionOptions`` of a CUDA EP session (:func:`~fastpath.engines.onnxruntime.engine.session_options`):
    ``intra_op_threads`` CPU threads (1: the calling thread alone; 0: one per CPU the process may use), spinning
    per :func:`cuda_allow_spinning`.

    Raises:
        ValueError: ``intra_op_threads`` < 0.
    """
    return session_options(intra_op_threads, cuda_allow_spinning(intra_op_threads))


def require_cuda_provider() -> None:
    """Raise unless this onnxruntime build has the CUDA execution provider.

    Raises:
        EngineError: naming the installed package and its providers, with what to install.
    """
    available = ort.get_available_providers()
    if PROVIDER not in available:
        raise EngineError(
            f"onnxruntime {ort.__version__} here has no {PROVIDER} (available: {', '.join(available)}); "
            "install onnxruntime-gpu matching the CUDA version, or use device='cpu'"
        )


class _BucketBinding:
    """The device buffers, host staging arrays and IOBinding of one bucket."""

    def __init__(self, session: ort.InferenceSession, bucket: Bucket, inputs: tuple[PaddedInput, ...], output: TensorSpec, device_id: int, graph_id: int) -> None:
        self.bucket = bucket
        self.host = {spec.name: np.zeros((bucket.batch, bucket.length), dtype=np.int64) for spec in inputs}
        self.device = {
            name: ort.OrtValue.ortvalue_from_shape_and_type([bucket.batch, bucket.length], np.int64, "cuda", device_id)
            for name in self.host
        }
        self.output = ort.OrtValue.ortvalue_from_shape_and_type([bucket.batch, output.shape[-1]], np.float32, "cuda", device_id)
        self.binding = session.io_binding()
        for name, value in self.device.items():
            self.binding.bind_ortvalue_input(name, value)
        self.binding.bind_ortvalue_output(output.name, self.output)
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("gpu_graph_id", str(graph_id))
        self.addresses = self.current_addresses()

    def current_addresses(self) -> dict[str, int]:
        found = {name: value.data_ptr() for name, value in self.device.items()}
        found["output"] = self.output.data_ptr()
        return found


class OnnxRuntimeCudaGraphEngine(Engine):
    """An ONNX model on the CUDA EP, one CUDA graph per (batch, length) bucket.

    Args:
        path: the ``.onnx`` file (inputs int64 [B, L]; one float32 [B, D] output).
        batch_sizes: batch buckets.
        lengths: length buckets (tokens).
        device_id: CUDA device ordinal.
        inputs: padding and filler rows of each input (BERT's by default).
        check_addresses: verify the bound buffers did not move before every replay.
        capture: capture all graphs at construction (otherwise call :meth:`warmup`).
        intra_op_threads: CPU threads of both sessions (:func:`cuda_session_options`).

    Raises:
        EngineError: no CUDA EP in this onnxruntime, or the model does not load.
    """

    name = "onnxruntime-cuda"

    def __init__(self, path: str, *, batch_sizes: Sequence[int], lengths: Sequence[int], device_id: int = 0,
                 inputs: tuple[PaddedInput, ...] = BERT_INPUTS, check_addresses: bool = False, capture: bool = True,
                 intra_op_threads: int = CUDA_INTRA_OP_THREADS) -> None:
        require_cuda_provider()
        provider = (PROVIDER, {"device_id": str(device_id), "enable_cuda_graph": "1"})
        options = cuda_session_options(intra_op_threads)
        try:
            self._session: ort.InferenceSession | None = ort.InferenceSession(path, options, providers=[provider])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/NoSuchFile types
            raise EngineError(f"ONNX Runtime (CUDA EP, graphs) could not load {path}: {exc}") from exc
        self._eager = OnnxRuntimeEngine(path, providers=((PROVIDER, {"device_id": str(device_id)}),), intra_op_threads=intra_op_threads,
                                        allow_spinning=cuda_allow_spinning(intra_op_threads))
        self._inputs = self._eager.inputs
        self._outputs = self._eager.outputs
        self.grid = BucketGrid(batch_sizes, lengths)
        self.padded_inputs = inputs
        self.check_addresses = check_addresses
        order = self.grid.capture_order()
        self._bindings = {
            bucket: _BucketBinding(self._session, bucket, inputs, self._outputs[0], device_id, graph_id)
            for graph_id, bucket in enumerate(order, start=1)
        }
        self._captured: list[Bucket] = []
        self._lock = threading.Lock()
        if capture:
            self.warmup()

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        return tuple(self._captured)

    def _run(self, binding: _BucketBinding) -> None:
        if self._session is None:
            raise EngineError("ONNX Runtime CUDA engine is closed")
        for name, host in binding.host.items():
            binding.device[name].update_inplace(host)
        if self.check_addresses and binding.current_addresses() != binding.addresses:
            raise EngineError(f"bound buffers of bucket {binding.bucket} moved since capture: {binding.addresses} -> {binding.current_addresses()}")
        try:
            self._session.run_with_iobinding(binding.binding, binding.run_options)
        except Exception as exc:
            raise EngineError(f"ONNX Runtime CUDA graph run failed for bucket {binding.bucket}: {exc}") from exc

    def warmup(self) -> None:
        """Capture every bucket, largest first: ONNX Runtime runs a few times, then captures."""
        with self._lock:
            for bucket, binding in self._bindings.items():
                if bucket in self._captured:
                    continue
                for spec in self.padded_inputs:
                    binding.host[spec.name][:] = filler_rows(bucket.batch, bucket.length, spec)
                for _ in range(3):  # the CUDA EP runs regularly before it captures (kMinNumRunsBeforeCudaGraphCapture)
                    self._run(binding)
                self._captured.append(bucket)

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, length = batch_shape(feeds, self.padded_inputs)
        bucket = self.grid.select(rows, length)
        if bucket is None or bucket not in self._captured:
            return self._eager.infer(feeds)
        binding = self._bindings[bucket]
        with self._lock:
            for spec in self.padded_inputs:
                stage_rows(binding.host[spec.name], feeds[spec.name], spec)
            self._run(binding)
            result = binding.output.numpy()[:rows].copy()
        return {self._outputs[0].name: result}

    @property
    def closed(self) -> bool:
        return self._session is None

    def close(self) -> None:
        with self._lock:
            self._bindings.clear()
            self._session = None
            self._eager.close()
