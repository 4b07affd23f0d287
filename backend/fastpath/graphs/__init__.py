"""The shared bucket/graph mechanism of FastPath's engines.

- :mod:`~fastpath.graphs.buckets` (pure): sorted batch sizes and lengths, ``bisect`` to pick; image side buckets.
- :mod:`~fastpath.graphs.staging` (numpy): padding rows, valid filler rows.
- :mod:`~fastpath.graphs.buffers` (torch): static buffers allocated once at the maximum, sliced.
- :mod:`~fastpath.graphs.runner` (torch): one ``torch.cuda.CUDAGraph`` per bucket in one pool,
  captured largest first after warm-up; replay with an address check; eager fallback.

Only the pure modules are imported here, so ONNX Runtime and TensorRT engines use the dispatcher
and staging without importing torch.
"""

from fastpath.graphs.buckets import Bucket, BucketGrid, ImageSideBuckets
from fastpath.graphs.staging import BERT_INPUTS, PaddedInput, batch_shape, filler_rows, stage_rows

__all__ = ["BERT_INPUTS", "Bucket", "BucketGrid", "ImageSideBuckets", "PaddedInput", "batch_shape", "filler_rows", "stage_rows"]
