"""Running a TensorRT plan: one execution context and one CUDA graph per bucket (TensorRT 10 API).

Written to the TensorRT 10 documentation ("Python API: IExecutionContext", "CUDA Graphs") and
TensorRT's ``samples/python/common_runtime.py``; TensorRT cannot be installed here, so this runs
only where ``import tensorrt`` works.

The shared bucket mechanism (:mod:`fastpath.graphs`) with TensorRT's pieces:

- device input/output buffers are allocated once at the largest bucket and every bucket binds
  prefixes of them with ``set_tensor_address``; host twins are page-locked. Both come from
  :mod:`fastpath.memory`'s allocators (``CudaDeviceAllocator``, ``CudaPinnedAllocator``), and every
  CUDA status goes through :func:`fastpath.memory.cuda.cuda_call`;
- each bucket has its own execution context on its own exact-shape profile; all contexts share
  one scratch block (``ExecutionContextAllocationStrategy.USER_MANAGED``), which is safe because
  every launch is serialized on one stream;
- after one plain ``execute_async_v3`` (TensorRT's deferred set-up must run outside a capture), a
  graph is captured around ``execute_async_v3`` with ``cudaStreamBeginCapture`` on a cuda-python
  stream and instantiated; replay is ``cudaGraphLaunch``;
- before a replay, ``check_addresses`` compares the context's tensor addresses with capture time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.engines.base import Engine, TensorSpec
from fastpath.engines.tensorrt.builder import EngineCache, build_serialized, require_tensorrt
from fastpath.engines.tensorrt.plan import plan_key
from fastpath.errors import EngineError
from fastpath.graphs import BERT_INPUTS, Bucket, BucketGrid, PaddedInput, batch_shape, filler_rows, stage_rows
from fastpath.manifest import sha256_file
from fastpath.memory.allocators import Allocator, Block, CudaDeviceAllocator, CudaPinnedAllocator
from fastpath.memory.cuda import cuda_call, runtime

INT64_BYTES = 8
FLOAT32_BYTES = 4


def cudart() -> Any:
    """cuda-python's runtime module (:func:`fastpath.memory.cuda.runtime`), or an error naming the package.

    Raises:
        EngineError: cuda-python (``cuda.bindings``) is not installed.
    """
    try:
        return runtime()
    except ImportError as exc:
        raise EngineError(f"the TensorRT runtime needs cuda-python ('pip install cuda-bindings'), which is not installed "
                          f"here ({exc}); use runtime 'torch' or 'onnxruntime' instead") from None


class _BucketContext:
    """One bucket's execution context, its instantiated CUDA graph and the addresses it was captured with."""

    def __init__(self, context: Any, bucket: Bucket) -> None:
        self.context = context
        self.bucket = bucket
        self.graph_exec: Any = None
        self.addresses: dict[str, int] = {}


class TensorRTEngine(Engine):
    """An ONNX model built into a TensorRT plan (cached), one CUDA graph per bucket.

    Args:
        path: the ``.onnx`` file (fp32 or INT8 QDQ); inputs int64 [B, L], one float32 [B, D] output.
        precision: ``fp32`` | ``fp16`` | ``int8`` | ``fp8``.
        batch_sizes, lengths: the buckets (one optimization profile and one graph each).
        cache_dir: engine and timing cache directory (default: ``.tensorrt`` beside the ONNX file).
        device_id: CUDA device ordinal.
        inputs: padding and filler rows of each input.
        check_addresses: verify tensor addresses before every replay.
        capture: capture the graphs at construction (otherwise call :meth:`warmup`).
        intra_op_threads: accepted like the other runtimes' options (text_embedding passes it); unused:
            TensorRT runs on the GPU.

    Raises:
        EngineError: TensorRT or cuda-python is missing (the message names the package), or the
            build fails.
        CudaError: a CUDA call fails (the message names the call and CUDA's error).
    """

    name = "tensorrt"

    def __init__(self, path: str, *, precision: str = "fp16", batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                 lengths: tuple[int, ...] = (16, 32, 64, 128, 256), cache_dir: str | None = None, device_id: int = 0,
                 inputs: tuple[PaddedInput, ...] = BERT_INPUTS, check_addresses: bool = False, capture: bool = True,
                 intra_op_threads: int = 0) -> None:
        trt = require_tensorrt()
        cuda = cudart()
        onnx_path = Path(path)
        cuda_call(cuda.cudaSetDevice(device_id), f"cudaSetDevice({device_id})")
        props = cuda_call(cuda.cudaGetDeviceProperties(device_id), f"cudaGetDeviceProperties({device_id})")
        self._device_allocator = CudaDeviceAllocator(device_id)
        self._pinned_allocator = CudaPinnedAllocator(device_id)
        self._blocks: list[tuple[Allocator, Block]] = []
        self.grid = BucketGrid(batch_sizes, lengths)
        self.padded_inputs = inputs
        self.check_addresses = check_addresses
        cache_root = Path(cache_dir) if cache_dir else onnx_path.parent / ".tensorrt"
        key = plan_key(onnx_sha256=sha256_file(onnx_path), gpu_name=props.name.decode(errors="replace").rstrip("\x00"),
                       compute_capability=(props.major, props.minor), tensorrt_version=trt.__version__,
                       precision=precision, grid=self.grid)
        plan = EngineCache(cache_root).get_or_build(
            key, lambda: build_serialized(onnx_path, self.grid, precision, timing_cache_path=cache_root / "timing.cache"))
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise EngineError(f"TensorRT could not deserialize the cached plan {EngineCache(cache_root).path(key)}; delete it to rebuild")
        self._trt = trt
        self._lock = threading.Lock()
        self._allocate()
        self._contexts = self._create_contexts()
        if capture:
            self.warmup()

    def _allocate(self) -> None:
        engine, trt = self._engine, self._trt
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(outputs) != 1:
            raise EngineError(f"the TensorRT plan has outputs {outputs}; expected exactly one [batch, dim] output")
        self._output_name = outputs[0]
        max_tokens = self.grid.max_batch * self.grid.max_length
        self._output_dim = int(engine.get_tensor_shape(self._output_name)[-1])
        output_bytes = self.grid.max_batch * self._output_dim * FLOAT32_BYTES
        self._device_inputs = {spec.name: self._block(self._device_allocator, max_tokens * INT64_BYTES) for spec in self.padded_inputs}
        self._host_inputs = {spec.name: self._block(self._pinned_allocator, max_tokens * INT64_BYTES) for spec in self.padded_inputs}
        self._device_output = self._block(self._device_allocator, output_bytes)
        self._host_output = self._block(self._pinned_allocator, output_bytes)
        size = getattr(engine, "device_memory_size_v2", None) or engine.device_memory_size
        self._scratch = self._block(self._device_allocator, max(int(size), 1))
        cuda = cudart()
        self._stream = cuda_call(cuda.cudaStreamCreateWithFlags(cuda.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self._inputs = tuple(TensorSpec(spec.name, np.dtype(np.int64), (-1, -1)) for spec in self.padded_inputs)
        self._outputs = (TensorSpec(self._output_name, np.dtype(np.float32), (-1, self._output_dim)),)

    def _block(self, allocator: Allocator, nbytes: int) -> Block:
        """One allocation of the engine's, freed by :meth:`close`."""
        block = allocator.allocate(nbytes)
        self._blocks.append((allocator, block))
        return block

    def _create_contexts(self) -> dict[Bucket, _BucketContext]:
        trt = self._trt
        contexts = {}
        for index, bucket in enumerate(self.grid.capture_order()):  # profile i serves bucket i (plan.bucket_profiles)
            context = self._engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            context.set_device_memory(self._scratch.address, self._scratch.nbytes)
            context.set_optimization_profile_async(index, self._stream)
            for spec in self.padded_inputs:
                context.set_input_shape(spec.name, (bucket.batch, bucket.length))
                context.set_tensor_address(spec.name, self._device_inputs[spec.name].address)
            context.set_tensor_address(self._output_name, self._device_output.address)
            contexts[bucket] = _BucketContext(context, bucket)
        return contexts

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        return tuple(b for b, c in self._contexts.items() if c.graph_exec is not None)

    def _addresses(self, entry: _BucketContext) -> dict[str, int]:
        names = [spec.name for spec in self.padded_inputs] + [self._output_name]
        return {name: int(entry.context.get_tensor_address(name)) for name in names}

    def _copy_inputs(self, bucket: Bucket) -> None:
        cuda = cudart()
        nbytes = bucket.tokens * INT64_BYTES
        for spec in self.padded_inputs:
            cuda_call(cuda.cudaMemcpyAsync(self._device_inputs[spec.name].address, self._host_inputs[spec.name].address, nbytes,
                                              cuda.cudaMemcpyKind.cudaMemcpyHostToDevice, self._stream), "cudaMemcpyAsync (inputs)")

    def _host_view(self, name: str, bucket: Bucket) -> np.ndarray:
        return self._host_inputs[name].array[: bucket.tokens * INT64_BYTES].view(np.int64).reshape(bucket.batch, bucket.length)

    def warmup(self) -> None:
        """Run each bucket once, then capture its CUDA graph, largest first."""
        cuda = cudart()
        with self._lock:
            for bucket, entry in self._contexts.items():
                if entry.graph_exec is not None:
                    continue
                for spec in self.padded_inputs:
                    self._host_view(spec.name, bucket)[:] = filler_rows(bucket.batch, bucket.length, spec)
                self._copy_inputs(bucket)
                if not entry.context.execute_async_v3(self._stream):
                    raise EngineError(f"TensorRT execute_async_v3 failed for bucket {bucket}")
                cuda_call(cuda.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
                cuda_call(cuda.cudaStreamBeginCapture(self._stream, cuda.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
                          f"cudaStreamBeginCapture (bucket {bucket})")
                entry.context.execute_async_v3(self._stream)
                graph = cuda_call(cuda.cudaStreamEndCapture(self._stream), f"cudaStreamEndCapture (bucket {bucket})")
                entry.graph_exec = cuda_call(cuda.cudaGraphInstantiate(graph, 0), f"cudaGraphInstantiate (bucket {bucket})")
                cuda_call(cuda.cudaGraphDestroy(graph), "cudaGraphDestroy")
                entry.addresses = self._addresses(entry)

    def _replay(self, bucket: Bucket, feeds: dict[str, np.ndarray], rows: int) -> np.ndarray:
        cuda = cudart()
        entry = self._contexts[bucket]
        for spec in self.padded_inputs:
            stage_rows(self._host_view(spec.name, bucket), feeds[spec.name], spec)
        self._copy_inputs(bucket)
        if self.check_addresses and self._addresses(entry) != entry.addresses:
            raise EngineError(f"tensor addresses of bucket {bucket} moved since capture: {entry.addresses} -> {self._addresses(entry)}")
        cuda_call(cuda.cudaGraphLaunch(entry.graph_exec, self._stream), f"cudaGraphLaunch (bucket {bucket})")
        nbytes = rows * self._output_dim * FLOAT32_BYTES
        cuda_call(cuda.cudaMemcpyAsync(self._host_output.address, self._device_output.address, nbytes,
                                          cuda.cudaMemcpyKind.cudaMemcpyDeviceToHost, self._stream), "cudaMemcpyAsync (output)")
        cuda_call(cuda.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        return self._host_output.array[:nbytes].view(np.float32).reshape(rows, self._output_dim).copy()

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, length = batch_shape(feeds, self.padded_inputs)
        if length > self.grid.max_length:
            raise EngineError(f"sequences of {length} tokens exceed the longest TensorRT profile ({self.grid.max_length}); add a length bucket")
        parts = []
        with self._lock:
            for start in range(0, rows, self.grid.max_batch):
                count = min(self.grid.max_batch, rows - start)
                bucket = self.grid.select(count, length)
                if bucket is None or self._contexts[bucket].graph_exec is None:
                    raise EngineError(f"no captured TensorRT graph for {count} x {length}; call warmup() first")
                chunk = {spec.name: feeds[spec.name][start : start + count] for spec in self.padded_inputs}
                parts.append(self._replay(bucket, chunk, count))
        return {self._output_name: parts[0] if len(parts) == 1 else np.concatenate(parts)}

    @property
    def closed(self) -> bool:
        return getattr(self, "_stream", None) is None

    def close(self) -> None:
        """Free graphs, contexts, buffers and the stream (idempotent)."""
        cuda = cudart()
        with self._lock:
            for entry in getattr(self, "_contexts", {}).values():
                if entry.graph_exec is not None:
                    cuda_call(cuda.cudaGraphExecDestroy(entry.graph_exec), "cudaGraphExecDestroy")
                    entry.graph_exec = None
            self._contexts = {}
            while getattr(self, "_blocks", None):
                allocator, block = self._blocks.pop()
                allocator.free(block)
            if getattr(self, "_stream", None) is not None:
                cuda_call(cuda.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
                self._stream = None
