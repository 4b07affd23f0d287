"""One ``torch.cuda.CUDAGraph`` per bucket, replayed on static buffers, with an eager fallback.

After SGLang's ``cuda_graph_runner`` and vLLM v1's CUDA-graph wrapper. :meth:`GraphRunner.capture` warms every
bucket up eagerly on a side stream, then captures the buckets largest first into one shared memory pool, each
graph ending with a copy into the static output (:class:`~fastpath.graphs.buffers.StaticBuffers`, allocated
once at the largest bucket). :meth:`GraphRunner.run` picks the smallest bucket that holds the batch (``bisect``),
pads the rows into the pinned host buffer (or takes a caller's block of the bucket's exact shape as it is:
:func:`~fastpath.graphs.staging.packed_inputs`), copies them to the device in one transfer, replays, and returns
a fresh array of the real rows. Larger batches are split; longer sequences run eagerly. One lock and one CUDA
stream per runner; with ``check_addresses`` a replay whose buffers moved since capture is refused.
Design: docs/design/engines.md#the-bucketgraph-mechanism-fastpathgraphs.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch

from fastpath.errors import EngineError
from fastpath.graphs.buckets import Bucket, BucketGrid
from fastpath.graphs.buffers import StaticBuffers
from fastpath.graphs.staging import PaddedInput, batch_shape, filler_rows, packed_inputs, stage_rows
from fastpath.graphs.streams import lease_streams, return_streams
from fastpath.profiling import PROFILE

LOG = logging.getLogger("fastpath.graphs")

Forward = Callable[..., torch.Tensor]
SYNC_MODES = ("blocking", "spin")


def cuda_device(device: torch.device | str) -> torch.device:
    """``device`` as a torch device with its GPU index: ``cuda`` becomes ``cuda:<current device>``.

    Every CUDA object of a runner (streams, events, the graph capture stream, pinned buffers) is
    made on this one device, so a process whose engine runs on GPU 1 (a Triton ``KIND_GPU``
    instance placed there) creates nothing on GPU 0, the current device of every thread until set.

    Raises:
        EngineError: a CUDA device was asked for and torch sees none, or fewer than its index.
    """
    target = torch.device(device)
    if target.type != "cuda":
        return target
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise EngineError(f"device {str(device)!r} was asked for but torch {torch.__version__} sees no CUDA device; use device='cpu'")
    index = torch.cuda.current_device() if target.index is None else target.index
    if index >= count:
        raise EngineError(f"device {str(device)!r} was asked for but torch sees {count} CUDA device(s), 0..{count - 1}; "
                          "check CUDA_VISIBLE_DEVICES and the instance group's gpus")
    return torch.device("cuda", index)


def device_scope(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` the calling thread's current CUDA device inside the block (nothing on the CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class GraphRunner:
    """Runs ``forward`` on padded batches through per-bucket CUDA graphs.

    Args:
        forward: ``forward(*inputs) -> Tensor`` on int64 [b, L] device tensors in the order of ``inputs``, giving
            [b, *output_shape] of any float dtype; capturable (no host synchronization, no data-dependent shapes).
        inputs, grid: the integer inputs with their pad values and filler rows; the buckets to capture.
        output_shape: trailing dimensions of one output row, e.g. ``(384,)``.
        device: a CUDA device for graphs; ``cpu`` runs the same staging with eager forwards.
        use_graphs: capture and replay graphs (CUDA only); False runs ``forward`` eagerly on the static buffers.
        check_addresses: before each replay, verify the static buffers did not move since capture.
        warmup_iters: eager runs of each bucket before capture.
        sync: how the host waits for a batch: ``spin`` (default; ``cudaStreamSynchronize``'s busy-wait, lowest
            wake-up latency) or ``blocking`` (sleeps on a ``cudaEventBlockingSync`` event, its core free meanwhile;
            slower on the H200: docs/benchmarks/triton_gpu_h200.md#defaults-measured-side-by-side).

    Attributes:
        replays, static_eager_runs: Counters per bucket of graph replays and of eager runs on the static buffers.
        direct_transfers, staged_transfers: batches sent from the caller's block as is, or padded into the host buffer first.
        eager_runs: batches that ran eagerly at their own shape (no bucket held them).
    """

    def __init__(
        self,
        forward: Forward,
        inputs: tuple[PaddedInput, ...],
        grid: BucketGrid,
        *,
        output_shape: tuple[int, ...],
        device: torch.device | str,
        use_graphs: bool = True,
        check_addresses: bool = False,
        warmup_iters: int = 2,
        sync: str = "spin",
    ) -> None:
        if sync not in SYNC_MODES:
            raise EngineError(f"sync={sync!r}: expected one of {', '.join(SYNC_MODES)}")
        self.device = cuda_device(device)
        if use_graphs and self.device.type != "cuda":
            raise EngineError(f"CUDA graphs need a CUDA device; got {self.device}. Pass use_graphs=False to run eagerly")
        longest_filler = max(len(spec.filler) for spec in inputs)
        if grid.lengths[0] < longest_filler:
            raise EngineError(f"bucket length {grid.lengths[0]} is shorter than the {longest_filler}-token filler row")
        self.forward = forward
        self.inputs = inputs
        self.grid = grid
        self.output_shape = output_shape
        self.use_graphs = use_graphs
        self.check_addresses = check_addresses
        self.warmup_iters = warmup_iters
        self.buffers: StaticBuffers | None = StaticBuffers(tuple(s.name for s in inputs), grid, output_shape, self.device)
        self._graphs: dict[Bucket, torch.cuda.CUDAGraph] = {}
        self._pool: tuple[int, int] | None = None
        self._addresses = {bucket: self.buffers.addresses(bucket) for bucket in grid.buckets}
        # replay and capture streams lent from the closed runners' (fastpath.graphs.streams: torch's cuBLAS
        # workspaces per stream would otherwise outlive each runner)
        self._streams = lease_streams(self.device) if self.device.type == "cuda" else None
        self._stream = self._streams[0] if self._streams else None
        self._lock = threading.Lock()
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if self.device.type == "cuda" else []
        self._done = torch.cuda.Event(blocking=True) if self.device.type == "cuda" and sync == "blocking" else None
        self.replays: Counter[Bucket] = Counter()
        self.direct_transfers = 0
        self.staged_transfers = 0
        self.static_eager_runs: Counter[Bucket] = Counter()
        self.eager_runs = 0

    @property
    def captured(self) -> tuple[Bucket, ...]:
        """Buckets with a captured graph, largest first."""
        return tuple(self._graphs)

    def graph(self, bucket: Bucket) -> torch.cuda.CUDAGraph | None:
        """The captured graph of ``bucket`` (for benchmarks timing replay alone), or None."""
        return self._graphs.get(bucket)

    def _live_buffers(self) -> StaticBuffers:
        if self.buffers is None:
            raise EngineError("the graph runner is closed")
        return self.buffers

    @contextlib.contextmanager
    def _stream_context(self) -> Iterator[None]:
        """The runner's device as the thread's current device and its stream as the current stream
        (scheduler threads start on device 0: events and kernels would otherwise go there)."""
        if self._stream is None:
            yield
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            yield

    def _synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def _stage_filler(self, bucket: Bucket) -> None:
        buffers = self._live_buffers()
        host = buffers.host_inputs_numpy(bucket)
        for index, spec in enumerate(self.inputs):
            host[index] = filler_rows(bucket.batch, bucket.length, spec)
        buffers.device_inputs(bucket).copy_(buffers.host_inputs(bucket), non_blocking=True)

    def _forward_into_output(self, bucket: Bucket) -> None:
        buffers = self._live_buffers()
        result = self.forward(*buffers.device_inputs(bucket).unbind(0))
        buffers.device_output(bucket).copy_(result)

    def capture(self, progress: Callable[[Iterator[Bucket]], Iterator[Bucket]] | None = None) -> None:
        """Warm up every bucket, then capture one graph per bucket, largest first, in one pool.

        Args:
            progress: optional wrapper of the bucket iterator (e.g. ``tqdm``) for a progress bar.

        Raises:
            EngineError: capture failed (the message names the bucket).
        """
        if not self.use_graphs or self._graphs:
            return
        order = self.grid.capture_order()
        with torch.cuda.device(self.device):
            side = self._streams[1] if self._streams else torch.cuda.Stream(self.device)  # none: an earlier capture failed
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side), torch.inference_mode():
                for bucket in order:
                    self._stage_filler(bucket)
                    for _ in range(self.warmup_iters):
                        self._forward_into_output(bucket)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            self._pool = torch.cuda.graph_pool_handle()
            for bucket in progress(iter(order)) if progress else order:
                graph = torch.cuda.CUDAGraph()
                try:
                    # capture on the runner's device: torch.cuda.graph's own default stream is made on
                    # whatever device is current when it is first used. thread_local: a live swap captures
                    # the new version beside the serving one in the same process, whose synchronizes and
                    # copies would otherwise invalidate this capture (global mode) and fail themselves
                    with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"), \
                            torch.inference_mode():
                        self._forward_into_output(bucket)
                except RuntimeError as exc:
                    self._streams = None  # a stream whose capture failed is not lent again
                    raise EngineError(f"CUDA graph capture failed for bucket batch={bucket.batch} length={bucket.length}: {exc}") from exc
                self._graphs[bucket] = graph
                self._addresses[bucket] = self._live_buffers().addresses(bucket)
            torch.cuda.synchronize(self.device)
        LOG.info("captured %d CUDA graphs (%s)", len(self._graphs), self.grid)

    def verify_addresses(self, bucket: Bucket) -> None:
        """Refuse to replay ``bucket`` if any static buffer's address differs from capture time.

        Raises:
            EngineError: naming the buffer, both addresses and the bucket.
        """
        now = self._live_buffers().addresses(bucket)
        for name, captured in self._addresses[bucket].items():
            if now[name] != captured:
                raise EngineError(
                    f"static buffer {name!r} of bucket batch={bucket.batch} length={bucket.length} moved from "
                    f"0x{captured:x} at capture to 0x{now[name]:x}: the graph would read or write stale memory; "
                    "recapture after reallocating buffers"
                )

    def _run_bucket(self, bucket: Bucket, feeds: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
        buffers = self._live_buffers()
        mark = PROFILE.start()
        source = packed_inputs(feeds, self.inputs, bucket)
        if source is None:  # not already the bucket's exact [num_inputs, b, L] block: pad into the static host buffer
            host = buffers.host_inputs_numpy(bucket)
            for index, spec in enumerate(self.inputs):
                stage_rows(host[index], feeds[spec.name], spec)
            source_tensor = buffers.host_inputs(bucket)
            self.staged_transfers += 1
        else:  # one DMA straight from the caller's block (the staging pool's page-locked lease)
            source_tensor = torch.from_numpy(source)
            self.direct_transfers += 1
        mark = PROFILE.lap("graph.host_stage_direct" if source is not None else "graph.host_stage_copy", mark)
        graph = self._graphs.get(bucket)
        events = self._events if PROFILE.enabled and self._events else []

        def record(index: int) -> None:  # CUDA-event marks for the phase profile (only when it is on)
            if events:
                events[index].record()

        with self._stream_context(), torch.inference_mode():
            record(0)
            buffers.device_inputs(bucket).copy_(source_tensor, non_blocking=True)
            record(1)
            if self.check_addresses:
                self.verify_addresses(bucket)
            if graph is not None:
                graph.replay()
                self.replays[bucket] += 1
            else:
                self._forward_into_output(bucket)
                self.static_eager_runs[bucket] += 1
            record(2)
            buffers.host_output(rows).copy_(buffers.device_output(bucket)[:rows], non_blocking=True)
            record(3)
            if self._done is not None:
                self._done.record()
        if self._done is not None:
            self._done.synchronize()  # the thread sleeps until the GPU reaches the event
        else:
            self._synchronize()
        if events:
            for phase, first, last in (("gpu.h2d", 0, 1), ("gpu.replay", 1, 2), ("gpu.d2h", 2, 3)):
                PROFILE.add(phase, events[first].elapsed_time(events[last]) * 1e-3)
        result = buffers.host_output_numpy(rows).copy()
        PROFILE.lap("graph.device_and_sync", mark)
        return result

    def run_eager(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """Run ``forward`` eagerly at the batch's own shape (no padding, no static buffers).

        Returns:
            float32 [batch, *output_shape].
        """
        batch_shape(feeds, self.inputs)
        tensors = [torch.from_numpy(np.ascontiguousarray(feeds[spec.name], dtype=np.int64)).to(self.device) for spec in self.inputs]
        with self._lock, device_scope(self.device), torch.inference_mode():
            self._live_buffers()
            result = self.forward(*tensors).float().cpu().numpy()
            self.eager_runs += 1
        return result

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """Run one batch: replay the smallest bucket that holds it, or fall back to eager.

        Args:
            feeds: input name -> int [n, l] arrays (n >= 1, l >= 1), same shape for every input.

        Returns:
            float32 [n, *output_shape], a fresh array (never a view of a reused buffer), row i
            for input row i; filler rows are never returned.

        Raises:
            EngineError: inputs missing or mis-shaped, the runner is closed, or a static buffer moved.
        """
        rows, length = batch_shape(feeds, self.inputs)
        if rows == 0 or length == 0:
            raise EngineError(f"empty batch of shape ({rows}, {length}) reached the engine; callers must reject it first")
        if length > self.grid.max_length:
            return self.run_eager(feeds)
        outputs = []
        for start in range(0, rows, self.grid.max_batch):
            # one chunk: the feeds as given (a PackedFeeds keeps its block for packed_inputs)
            chunk = feeds if rows <= self.grid.max_batch else {
                spec.name: feeds[spec.name][start : start + self.grid.max_batch] for spec in self.inputs}
            count = min(self.grid.max_batch, rows - start)
            bucket = self.grid.select(count, length)
            if bucket is None:  # unreachable: count <= max_batch and length <= max_length
                raise EngineError(f"no bucket holds {count} x {length} in {self.grid}")
            with self._lock:
                outputs.append(self._run_bucket(bucket, chunk, count))
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)

    def close(self) -> None:
        """Release graphs, pool and buffers now, while the CUDA context is alive (idempotent).

        Left to the interpreter's exit, their destructors run in its last garbage collection after
        the CUDA runtime has begun to shut down, and the Triton stub dies with a segmentation fault
        at unload (docs/known-issues.md); so collect here and wait for the GPU.
        """
        with self._lock:
            self._graphs.clear()
            self._pool = None
            self.buffers = None
        gc.collect()
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            with torch.cuda.device(self.device):
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
            with self._lock:
                streams, self._streams, self._stream = self._streams, None, None
            if streams is not None:  # the graphs are gone and the device idle: the next runner may capture on them
                return_streams(self.device, streams)
