"""Static input/output buffers: allocated once at the largest bucket, sliced per bucket.

A captured CUDA graph reads and writes fixed device addresses, so every bucket's inputs and
outputs must live in memory that never moves. :class:`StaticBuffers`
allocates, at construction:

- one flat int64 device buffer of ``num_inputs * max_batch * max_length`` elements; bucket
  ``(b, L)`` uses its first ``num_inputs * b * L`` elements viewed as ``[num_inputs, b, L]``, so
  one host-to-device copy moves all of a batch's inputs;
- its host twin (page-locked when CUDA is present, so the copy is a true asynchronous DMA);
- one flat float32 device buffer of ``max_batch * prod(output_shape)`` elements, bucket ``(b, L)``
  using its first ``b`` rows, and its host twin.

Views are computed from the same base tensors every time, so a bucket's addresses are a pure
function of the bucket; :meth:`StaticBuffers.addresses` reports them for the capture/replay check.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fastpath.graphs.buckets import Bucket, BucketGrid


class StaticBuffers:
    """Fixed device and host buffers for every bucket of a grid.

    Args:
        input_names: names of the integer inputs, in the order they are packed.
        grid: the bucket grid; buffers are sized for ``grid.max_batch`` x ``grid.max_length``.
        output_shape: trailing output dimensions per row, e.g. ``(384,)``.
        device: where the device buffers live (``cuda:N``, or ``cpu`` for eager-only use).
    """

    def __init__(self, input_names: tuple[str, ...], grid: BucketGrid, output_shape: tuple[int, ...], device: torch.device) -> None:
        self.input_names = input_names
        self.grid = grid
        self.output_shape = output_shape
        self.device = device
        pin = device.type == "cuda"
        input_elements = len(input_names) * grid.max_batch * grid.max_length
        self._row_elements = math.prod(output_shape)
        output_elements = grid.max_batch * self._row_elements
        self._device_inputs = torch.zeros(input_elements, dtype=torch.int64, device=device)
        self._host_inputs = torch.zeros(input_elements, dtype=torch.int64, pin_memory=pin)
        self._device_output = torch.zeros(output_elements, dtype=torch.float32, device=device)
        self._host_output = torch.zeros(output_elements, dtype=torch.float32, pin_memory=pin)
        self._host_inputs_np = self._host_inputs.numpy()
        self._host_output_np = self._host_output.numpy()

    @property
    def nbytes(self) -> int:
        """Bytes of device memory held (inputs + output)."""
        return self._device_inputs.nbytes + self._device_output.nbytes

    def _input_shape(self, bucket: Bucket) -> tuple[int, int, int]:
        return (len(self.input_names), bucket.batch, bucket.length)

    def device_inputs(self, bucket: Bucket) -> torch.Tensor:
        """int64 [num_inputs, b, L] view of the device input buffer."""
        shape = self._input_shape(bucket)
        return self._device_inputs[: math.prod(shape)].view(shape)

    def host_inputs(self, bucket: Bucket) -> torch.Tensor:
        """int64 [num_inputs, b, L] view of the host (pinned) input buffer."""
        shape = self._input_shape(bucket)
        return self._host_inputs[: math.prod(shape)].view(shape)

    def host_inputs_numpy(self, bucket: Bucket) -> np.ndarray:
        """The same host view as a numpy array (writes go straight to pinned memory)."""
        shape = self._input_shape(bucket)
        return self._host_inputs_np[: math.prod(shape)].reshape(shape)

    def device_output(self, bucket: Bucket) -> torch.Tensor:
        """float32 [b, *output_shape] view of the device output buffer."""
        return self._device_output[: bucket.batch * self._row_elements].view(bucket.batch, *self.output_shape)

    def host_output(self, rows: int) -> torch.Tensor:
        """float32 [rows, *output_shape] view of the host (pinned) output buffer."""
        return self._host_output[: rows * self._row_elements].view(rows, *self.output_shape)

    def host_output_numpy(self, rows: int) -> np.ndarray:
        """The same host output view as a numpy array."""
        return self._host_output_np[: rows * self._row_elements].reshape(rows, *self.output_shape)

    def addresses(self, bucket: Bucket) -> dict[str, int]:
        """Device addresses a graph of ``bucket`` reads and writes: each input's view and the output."""
        inputs = self.device_inputs(bucket)
        found = {name: inputs[index].data_ptr() for index, name in enumerate(self.input_names)}
        found["output"] = self.device_output(bucket).data_ptr()
        return found
