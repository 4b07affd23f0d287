"""Staging, running and answering text-embedding batches: the model's :class:`BatchHandler`.

:class:`EmbeddingBatchHandler` is what :class:`~fastpath.scheduling.BatchRunner` calls for each batch
of ``model_repository/text_embedding`` (:mod:`fastpath.models.text_embedding.model`): ``stage`` pads the
batch's token ids into one block of the host staging pool, ``run`` runs the active version's engine
on it, ``finish`` hands each text its row. :func:`warm_up` seeds the cost model at load.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fastpath.errors import EngineError
from fastpath.graphs.buckets import BucketGrid
from fastpath.graphs.staging import PackedFeeds
from fastpath.memory import BlockPool, Lease, PoolConfig
from fastpath.models.text_embedding.pipeline import EMBEDDING_DIM
from fastpath.models.text_embedding.versions import VersionedEmbedder
from fastpath.profiling import PROFILE
from fastpath.scheduling import Batch, CostModel
from fastpath.text import EncodedBatch

TOKEN_INPUTS = 3  # input_ids, attention_mask, token_type_ids: int64 [rows, length] each
FEED_NAMES = ("input_ids", "attention_mask", "token_type_ids")  # EncodedBatch's fields, in the engines' input order


def staging_pool_config(max_batch_texts: int, max_seq_length: int) -> PoolConfig:
    """Host staging pool for text batches: blocks up to the largest batch (3 int64 [rows, length]
    inputs), room for 4 of them (one staged, one running, slack); waits 1 s, then UNAVAILABLE."""
    largest = TOKEN_INPUTS * max_batch_texts * max_seq_length * 8
    block = max(4096, 1 << (largest - 1).bit_length())
    return PoolConfig(capacity_bytes=4 * block, max_block_bytes=block)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class EmbeddingRow:
    """One text's result, as the scheduler hands it to the request's ticket.

    Attributes:
        embedding: float32 ``[384]``, a view of the batch output (L2-normalized).
        token_count: tokens the model saw, [CLS] and [SEP] included (<= ``max_seq_length``).
        truncated: the text was longer than ``max_seq_length`` tokens and was cut.
        version: the model version whose engine produced the row.
    """

    embedding: np.ndarray
    token_count: int
    truncated: bool
    version: int


# output name -> (EmbeddingRow field, dtype) of the [n, 1] outputs
_ROW_OUTPUTS = {"TOKEN_COUNT": ("token_count", np.int32), "TRUNCATED": ("truncated", np.bool_),
                "MODEL_VERSION": ("version", np.int32)}


def output_array(name: str, rows: list[EmbeddingRow]) -> np.ndarray:
    """Output ``name`` of a request from its rows: ``EMBEDDING`` float32 [n, 384]; ``TOKEN_COUNT`` int32,
    ``TRUNCATED`` bool and ``MODEL_VERSION`` int32, each [n, 1] (:mod:`fastpath.models.text_embedding.model`)."""
    if name == "EMBEDDING":
        # one row: a [1, 384] view of the batch output (pb.Tensor copies it into the stub's shared memory)
        stacked = rows[0].embedding[None] if len(rows) == 1 else np.stack([row.embedding for row in rows])
        return stacked.astype(np.float32, copy=False)
    field, dtype = _ROW_OUTPUTS[name]
    return np.array([[getattr(row, field)] for row in rows], dtype=dtype)


@dataclasses.dataclass(eq=False)
class StagedBatch:
    """Engine inputs of one batch, views of one staging-pool lease (released after the engine call)."""

    feeds: dict[str, np.ndarray]
    lease: Lease


class EmbeddingBatchHandler:
    """Stages, runs and delivers one scheduler batch with the tokenizer and the active engine slot.

    Each batch's three inputs are padded straight into one block leased from the host staging pool
    (page-locked when CUDA is present, so the engine's host-to-device copy is one DMA per input):
    that single copy is the batching. ``run`` releases the lease once the engine has
    returned. Filler rows (batch bucket > real texts) are ``[CLS] [SEP]``, the encoding of the
    empty text; they never reach a response, so a text's row does not depend on its batch
    neighbours. ``run`` leases the active slot of
    :class:`~fastpath.models.text_embedding.versions.VersionedEmbedder` for the batch, so a batch dispatched
    before a swap finishes on the old version and every row knows its version.

    Args:
        versions: the model's engine slots.
        pool: host staging pool (see :func:`staging_pool_config`).
        on_batch: called after each engine call (e.g. publish pool metrics).
    """

    def __init__(self, versions: VersionedEmbedder, pool: BlockPool, on_batch: Any = None) -> None:
        self.versions = versions
        self.embedder = versions.initial
        self.pool = pool
        self.on_batch = on_batch
        self._filler = self.embedder.tokenizer.encode([""])[0]
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()

    def stage(self, batch: Batch) -> StagedBatch:
        """int64 [batch_size, length] input_ids / attention_mask / token_type_ids in one pool block.

        Raises:
            UnavailableError: the pool stayed exhausted for its wait timeout (retryable).
        """
        return self.stage_encodings([item.payload for item in batch.items], batch.batch_size, batch.length)

    def stage_encodings(self, encodings: list[Any], rows: int, length: int) -> StagedBatch:
        """:meth:`stage` for ``encodings`` (at most ``rows``; filler rows after them) padded to ``length``."""
        lease, feeds = self._staged(encodings, rows, length)
        with self._lock:
            self._leases.add(lease)
        return StagedBatch(feeds, lease)

    def _staged(self, encodings: list[Any], rows: int, length: int) -> tuple[Lease, PackedFeeds]:
        """A lease of one block holding ``encodings`` (filler rows after them) padded to ``length``, and its feeds."""
        lease = self.pool.lease(TOKEN_INPUTS * rows * length * 8)
        try:
            feeds, parts = self._feeds(lease, rows, length)
            self.embedder.tokenizer.pad(encodings + [self._filler] * (rows - len(encodings)), length, out=parts)
        except BaseException:
            lease.release()
            raise
        return lease, feeds

    @staticmethod
    def _feeds(lease: Lease, rows: int, length: int) -> tuple[PackedFeeds, EncodedBatch]:
        """The block of ``lease`` as one int64 [3, rows, length] view, its slabs the three inputs (each contiguous,
        the block the engine's one host-to-device copy), as feeds and as the tokenizer's ``out``; kept with the
        block for its next leases of that shape (what that saves: docs/benchmarks/scheduler_cpu.md)."""
        def make() -> tuple[PackedFeeds, EncodedBatch]:
            feeds = PackedFeeds(lease.view(np.int64, (TOKEN_INPUTS, rows, length)), FEED_NAMES)
            return feeds, EncodedBatch(*feeds.parts)

        return lease.kept(("text_feeds", rows, length), make)

    def run(self, staged: StagedBatch, lane: int | None = None) -> tuple[np.ndarray, int]:
        """(float32 [batch_size, 384], model version); raises EngineError on a failure or a wrong shape.

        ``lane``: None runs the engine's main session; an index runs that engine lane
        (``concurrent_batches`` > 1, see :class:`~fastpath.scheduling.BatchRunner`).
        """
        feeds = staged.feeds
        try:
            with self.versions.lease() as (embedder, version):
                engine = embedder.engine
                name = engine.outputs[0].name
                mark = PROFILE.start()
                output = (engine.infer(feeds) if lane is None else engine.infer_lane(feeds, lane))[name]
                PROFILE.lap("engine.infer" if lane is None else "engine.infer_lane", mark)
        finally:
            self._release(staged.lease)
            if self.on_batch is not None:
                self.on_batch()
        rows = feeds["input_ids"].shape[0]
        if output.shape != (rows, EMBEDDING_DIM):
            raise EngineError(f"engine returned {name} of shape {output.shape}; expected ({rows}, {EMBEDDING_DIM})")
        return output, version

    def _release(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)
        lease.release()

    def close(self) -> int:
        """Release the leases of batches staged but never run (unload); returns how many."""
        with self._lock:
            leases, self._leases = list(self._leases), set()
        for lease in leases:
            lease.release()
        return len(leases)

    def run_plan(self, count: int, plan: list[Batch], ran: Callable[[Batch, float], None]) -> tuple[np.ndarray, int]:
        """Run one ``execute()`` call's planned batches (:meth:`~fastpath.scheduling.CallPlanPolicy.plan`)
        on one model version, so every row of the call shares it (no swap can flip between them).

        Args:
            count: the call's texts.
            plan: its batches; each item's ``payload`` is a text's encoding and ``row`` its position
                in the call, each of ``0 .. count-1`` in exactly one batch.
            ran: called after each engine call with the batch and its engine seconds (cost model, metrics).

        Returns:
            (float32 [count, 384] in the order of the call's texts, the model version).

        Raises:
            UnavailableError: the staging pool stayed exhausted (retryable).
            EngineError: the engine failed or returned a wrong shape; the call's requests fail.
        """
        embeddings = None
        mark = PROFILE.start()
        with self.versions.lease() as (embedder, version):
            engine = embedder.engine
            name = engine.outputs[0].name
            for planned in plan:
                # not tracked for close(): released right after its engine call
                lease, feeds = self._staged([item.payload for item in planned.items], planned.batch_size, planned.length)
                mark = PROFILE.lap("run.stage", mark)
                try:
                    begin = time.perf_counter()
                    output = engine.infer(feeds)[name]
                    seconds = time.perf_counter() - begin
                finally:
                    lease.release()
                    if self.on_batch is not None:
                        self.on_batch()
                mark = PROFILE.lap("engine.infer", mark)
                if output.shape != (planned.batch_size, EMBEDDING_DIM):
                    raise EngineError(f"engine returned {name} of shape {output.shape}; expected ({planned.batch_size}, {EMBEDDING_DIM})")
                rows = [item.row for item in planned.items]
                if len(plan) == 1 and rows == list(range(count)):
                    embeddings = output[: planned.texts]  # already in order: no scatter, no second array
                else:
                    if embeddings is None:
                        embeddings = np.empty((count, EMBEDDING_DIM), dtype=np.float32)
                    embeddings[rows] = output[: planned.texts]
                ran(planned, seconds)
                mark = PROFILE.lap("run.observe", mark)
        return embeddings, version

    def finish(self, batch: Batch, outputs: tuple[np.ndarray, int]) -> None:
        embeddings, version = outputs
        truncated = self.embedder.tokenizer.truncated
        for index, item in enumerate(batch.items):
            encoding = item.payload
            item.ticket.set_row(item.row, EmbeddingRow(embeddings[index], item.tokens, truncated(encoding), version))


def register_allocation_counters(pool: BlockPool, engine: Any) -> None:
    """Profile counters of allocations since now (steady state allocates nothing): the staging pool's
    allocator calls and, for the torch runtime on CUDA, the caching allocator's device allocations."""
    base = pool.stats().allocations
    PROFILE.counter("staging_pool.allocations", lambda: pool.stats().allocations - base)
    PROFILE.counter("staging_pool.leases", lambda: pool.stats().leases)
    device = getattr(getattr(engine, "runner", None), "device", None)
    if device is not None and device.type == "cuda":
        import torch

        def allocated() -> int:
            return int(torch.cuda.memory_stats(device).get("allocation.all.allocated", 0))

        start = allocated()
        PROFILE.counter("torch.device_allocations", lambda: allocated() - start)


def warm_up(handler: EmbeddingBatchHandler, grid: BucketGrid, costs: CostModel, clock: Any) -> None:
    """Run a few of ``grid``'s batch shapes to warm the engine and seed ``costs`` (engine lanes were
    warmed at load: ``TextEmbedder.check_lanes``).

    Six shapes (batch 1/4/16 x two lengths), each run three times; the fastest of the last two
    seeds the model (on a shared machine other work only ever adds time). How long it takes:
    docs/design/scheduler.md#cost-model-costmodel.
    """
    lengths = [grid.lengths.up(16), grid.lengths.up(48)]
    sizes = [b for b in grid.batch_sizes if b in (1, 4, 16)]
    for length in dict.fromkeys(length for length in lengths if length is not None) or grid.lengths[:1]:
        for size in sizes:
            shape = Batch(items=(), batch_size=size, length=length, rule="warmup", formed_s=0.0, predicted_s=0.0)
            handler.run(handler.stage(shape))
            timings = []
            for _ in range(2):
                staged = handler.stage(shape)  # each run releases its staging lease
                start_s = clock.now()
                handler.run(staged)
                timings.append(clock.now() - start_s)
            costs.observe(size, length, min(timings))
