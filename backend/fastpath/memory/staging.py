"""Staging a batch input: the request tensors copied once into one contiguous pool block.

That single copy *is* the batching: request arrays ``[n_i, *dims]`` become one array
``[sum(n_i), *dims]`` in a leased (page-locked, when CUDA is present) block, ready for one DMA.
Large batches can be copied by several threads (:class:`ParallelCopier`; numpy releases the GIL
while copying), since one core's memcpy is slower than the DMA that follows it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence

import numpy as np

from fastpath.errors import InvalidInputError
from fastpath.memory.pool import BlockPool, Lease


@dataclasses.dataclass(eq=False)
class StagedTensor:
    """One batch input staged in a pool block; a context manager that releases the lease.

    Attributes:
        name: input tensor name.
        lease: the pool lease holding the data (a zero-byte lease for empty tensors).
        array: ``[sum(rows), *dims]`` view over the lease (valid until release).
        rows: batch rows contributed by each request, in order.
    """

    name: str
    lease: Lease
    array: np.ndarray
    rows: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the staged data (0 for an empty tensor)."""
        return int(self.array.nbytes)

    def release(self) -> None:
        """Release the lease (the array must no longer be used)."""
        self.lease.release()

    def __enter__(self) -> StagedTensor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.lease.released:
            self.lease.release()


class ParallelCopier:
    """Copies request tensors into a staging array with a few threads; a context manager.

    Args:
        workers: copy threads (>= 1).
        min_parallel_bytes: batches smaller than this are copied by the calling thread
            (a thread hand-off costs tens of microseconds).
        min_chunk_bytes: smallest piece handed to a thread; a part larger than
            ``nbytes / (2 * workers)`` is split along its rows.
    """

    def __init__(self, workers: int, *, min_parallel_bytes: int = 4 << 20, min_chunk_bytes: int = 1 << 20) -> None:
        if workers < 1:
            raise ValueError(f"ParallelCopier needs workers >= 1, got {workers}")
        self.workers = workers
        self.min_parallel_bytes = min_parallel_bytes
        self.min_chunk_bytes = min_chunk_bytes
        self.tasks_submitted = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="fastpath-stage")

    def copy(self, out: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        """Write ``parts`` one after another along axis 0 of ``out`` (shapes already validated)."""
        if out.nbytes < self.min_parallel_bytes or self.workers == 1:
            _serial_copy(out, parts)
            return
        chunk_bytes = max(out.nbytes // (2 * self.workers), self.min_chunk_bytes)
        tasks, row = [], 0
        for part in parts:
            rows = int(part.shape[0])
            row_bytes = max(part.nbytes // max(rows, 1), 1)
            step = max(1, chunk_bytes // row_bytes)
            for start in range(0, rows, step):
                stop = min(rows, start + step)
                tasks.append(self._executor.submit(np.copyto, out[row + start : row + stop], part[start:stop], "no"))
            row += rows
        self.tasks_submitted += len(tasks)
        for task in tasks:
            task.result()

    def close(self) -> None:
        """Stop the threads (idempotent)."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> ParallelCopier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _serial_copy(out: np.ndarray, parts: Sequence[np.ndarray]) -> None:
    if len(parts) == 1:
        np.copyto(out, parts[0], casting="no")
    else:
        np.concatenate(parts, axis=0, out=out)


def batch_layout(name: str, parts: Sequence[np.ndarray]) -> tuple[np.dtype, tuple[int, ...]]:
    """dtype and shape ``[sum(n_i), *dims]`` of the batch formed by ``parts``.

    Raises:
        InvalidInputError: no parts, a 0-d part, object (BYTES) dtype, or parts whose dtype or
            trailing dimensions differ from the first part's (the message names both).
    """
    if not parts:
        raise InvalidInputError(f"input {name}: a batch needs at least one request tensor, got none")
    first = parts[0]
    dtype, dims = first.dtype, first.shape[1:]
    if first.ndim == 0:
        raise InvalidInputError(f"input {name}: request 0 is a 0-d array; expected a batch dimension first")
    if dtype.hasobject:
        raise InvalidInputError(f"input {name}: dtype {dtype} (BYTES) cannot be staged in raw memory; tokenize first")
    for index, part in enumerate(parts[1:], start=1):
        if part.dtype != dtype or part.ndim != first.ndim or part.shape[1:] != dims:
            raise InvalidInputError(
                f"input {name}: request {index} has {part.dtype}{list(part.shape)}, "
                f"expected {dtype}[n, {', '.join(map(str, dims))}] like request 0"
            )
    return dtype, (sum(int(part.shape[0]) for part in parts), *dims)


def stage(pool: BlockPool, name: str, parts: Sequence[np.ndarray], *, timeout_s: float | None = None,
          copier: ParallelCopier | None = None) -> StagedTensor:
    """Copy ``parts`` (batch dimension first) into one contiguous block leased from ``pool``.

    Args:
        pool: host staging pool.
        name: input name, for error messages.
        parts: per-request arrays ``[n_i, *dims]`` of one dtype.
        timeout_s: wait bound when the pool is exhausted (default: the pool's).
        copier: copy with these threads (default: the calling thread alone).

    Returns:
        The staged tensor; release it (or use ``with``) once the data has been consumed.

    Raises:
        InvalidInputError: the parts do not form one batch (see :func:`batch_layout`), or the
            batch exceeds the pool's largest block.
        UnavailableError: the pool stayed exhausted (retryable).
    """
    dtype, shape = batch_layout(name, parts)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    lease = pool.lease(nbytes, timeout_s=timeout_s)
    try:
        array = lease.view(dtype, shape)
        if nbytes:
            (copier.copy if copier is not None else _serial_copy)(array, parts)
    except BaseException:
        lease.release()
        raise
    return StagedTensor(name, lease, array, tuple(int(part.shape[0]) for part in parts))
