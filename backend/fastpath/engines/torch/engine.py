"""The torch runtime: all-MiniLM-L6-v2 on a CUDA GPU in FP16 (or BF16/FP32/FP8), CUDA graph per bucket.

Loads a safetensors file written by ``fastpath build`` (or the package's ``model.safetensors``),
builds :class:`~fastpath.engines.torch.bert.BertEmbedder` and hands it to a
:class:`~fastpath.graphs.runner.GraphRunner`, which captures one ``torch.cuda.CUDAGraph`` per
(batch, length) bucket into one shared pool, largest first, after warm-up.

Imports only torch, numpy and safetensors: it loads inside the Triton python-backend stub, where
numpy is 1.x and ``transformers`` does not import. On a machine
without CUDA it runs eagerly on the CPU (same padding and slicing), which is what the unit tests use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from fastpath.engines.base import Engine, TensorSpec, check_feeds, check_outputs
from fastpath.engines.torch.bert import BertEmbedder
from fastpath.engines.torch.weights import load_weights
from fastpath.errors import ConfigError, EngineError, InvalidInputError
from fastpath.graphs import BERT_INPUTS, Bucket, BucketGrid, batch_shape
from fastpath.graphs.runner import GraphRunner, cuda_device, device_scope

LOG = logging.getLogger("fastpath.engines.torch")

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float16}
# Buckets: powers of two up to the model's max_batch_texts (64) and the config's length buckets
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_LENGTHS = (16, 32, 64, 128, 256)


HEADROOM_BYTES = 512 << 20  # CUDA context growth, cuBLAS workspaces, the caching allocator's slack


def device_bytes_needed(parameters: int, element_bytes: int, max_batch: int, max_length: int, hidden: int,
                        intermediate: int) -> int:
    """Conservative device memory, in bytes, for one engine: weights + one bucket's activations + headroom.

    Weights: ``parameters * element_bytes``. Activations (shared graph pool, sized by the largest
    bucket): the widest per-token tensors alive at once, query/key/value + attention output +
    the feed-forward intermediate, ``max_batch * max_length * (4 * hidden + intermediate) *
    element_bytes``, doubled for the attention scores and temporaries. Plus ``HEADROOM_BYTES``.
    """
    weights = parameters * element_bytes
    activations = 2 * max_batch * max_length * (4 * hidden + intermediate) * element_bytes
    return weights + activations + HEADROOM_BYTES


def check_device_memory(free_bytes: int, needed_bytes: int, device: str) -> None:
    """Refuse to load when ``device`` has less than ``needed_bytes`` free.

    A live swap loads the standby engine beside the serving one; when both do not fit, FastPath
    refuses the swap (the serving version keeps serving) rather than unloading first, which would
    leave the model unavailable for the whole load (docs/design/hot-swap.md).

    Raises:
        EngineError: not enough free device memory, naming both figures in MiB.
    """
    if free_bytes < needed_bytes:
        raise EngineError(
            f"not enough free memory on {device} for another engine: about {needed_bytes >> 20} MiB needed "
            f"(weights + largest bucket's activations + {HEADROOM_BYTES >> 20} MiB headroom), {free_bytes >> 20} MiB free; "
            "a live swap needs the serving and the standby engine at once: free device memory, or unload "
            "another model, then retry"
        )


class TorchEngine(Engine):
    """all-MiniLM-L6-v2 in plain PyTorch with one CUDA graph per bucket.

    Args:
        path: safetensors weights (``model.fp16.safetensors`` of a version directory).
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"``; CUDA graphs are captured only on CUDA.
        precision: ``fp16`` (default), ``bf16``, ``fp32``, or ``fp8`` (e4m3 linear layers through
            ``torch._scaled_mm``, FP16 elsewhere).
        batch_sizes, lengths: the batch and sequence-length (tokens; at most max_position_embeddings) buckets to capture.
        use_graphs: capture and replay CUDA graphs (ignored on CPU, which always runs eagerly).
        check_addresses: verify static buffers never move between capture and replay.
        capture: capture at construction (otherwise call :meth:`warmup`).
        intra_op_threads: CPU threads for eager CPU runs; 0 leaves PyTorch's default.
        sync: how the host waits while a batch runs, ``spin`` or ``blocking`` (:class:`~fastpath.graphs.runner.GraphRunner`).

    Raises:
        ConfigError: unknown precision, or a length bucket beyond the model's positions.
        ArtifactError: the weights file is missing, unreadable or incomplete.
        EngineError: CUDA was asked for and is not available, or capture failed.
    """

    name = "torch"

    def __init__(
        self,
        path: str,
        *,
        device: str = "cuda",
        precision: str = "fp16",
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        lengths: Sequence[int] = DEFAULT_LENGTHS,
        use_graphs: bool = True,
        check_addresses: bool = False,
        capture: bool = True,
        intra_op_threads: int = 0,
        sync: str = "spin",
    ) -> None:
        if precision not in PRECISIONS:
            raise ConfigError(f"torch runtime precision {precision!r} is not one of {', '.join(PRECISIONS)}")
        target = cuda_device(device)
        if intra_op_threads > 0:
            torch.set_num_threads(intra_op_threads)
        config, weights = load_weights(path)
        self.grid = BucketGrid(batch_sizes, lengths)
        if target.type == "cuda":
            free_bytes, _total = torch.cuda.mem_get_info(target)
            element_bytes = torch.finfo(PRECISIONS[precision]).bits // 8
            check_device_memory(free_bytes, device_bytes_needed(
                sum(t.numel() for t in weights.values()), element_bytes, self.grid.max_batch, self.grid.max_length,
                config.hidden_size, config.intermediate_size), str(target))
        if self.grid.max_length > config.max_position_embeddings:
            raise ConfigError(f"length bucket {self.grid.max_length} exceeds the model's {config.max_position_embeddings} positions")
        self.precision = precision
        self.config = config
        self.device = target
        with device_scope(target):  # cuBLAS handles, allocator pools and pinned buffers on this engine's GPU
            self.model: BertEmbedder | None = BertEmbedder(config, weights, dtype=PRECISIONS[precision], device=target, fp8=precision == "fp8")
            del weights
            self.runner: GraphRunner | None = GraphRunner(
                self.model,
                BERT_INPUTS,
                self.grid,
                output_shape=(config.hidden_size,),
                device=target,
                use_graphs=use_graphs and target.type == "cuda",
                check_addresses=check_addresses,
                sync=sync,
            )
        self._inputs = tuple(TensorSpec(spec.name, np.dtype(np.int64), (-1, -1)) for spec in BERT_INPUTS)
        self._outputs = (TensorSpec("embedding", np.dtype(np.float32), (-1, config.hidden_size)),)
        if capture:
            try:
                self.warmup()
            except BaseException:  # a failed warm-up or capture gives its graphs, buffers and streams back
                self.close()
                raise

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        """Buckets served by a captured graph (empty when running eagerly)."""
        return self._live_runner().captured

    def _live_runner(self) -> GraphRunner:
        if self.runner is None:
            raise EngineError("torch engine is closed")
        return self.runner

    def warmup(self) -> None:
        """Capture the CUDA graphs (on CUDA) and run one batch through every path."""
        runner = self._live_runner()
        runner.capture()
        LOG.info("torch engine ready: %s on %s, %d graphs", self.precision, runner.device, len(runner.captured))

    def _validate(self, feeds: dict[str, np.ndarray]) -> None:
        """Host-side range checks: an out-of-range id on the GPU is a device assert that kills the process."""
        batch_shape(feeds, BERT_INPUTS)
        checks = (
            ("input_ids", 0, self.config.vocab_size - 1),
            ("attention_mask", 0, 1),
            ("token_type_ids", 0, self.config.type_vocab_size - 1),
        )
        for name, low, high in checks:
            values = feeds[name]
            if values.size and (values.min() < low or values.max() > high):
                raise InvalidInputError(f"{name} holds values in [{values.min()}, {values.max()}]; expected [{low}, {high}]")
        length = feeds["input_ids"].shape[1]
        if length > self.config.max_position_embeddings:
            raise InvalidInputError(f"sequence of {length} tokens exceeds the model's {self.config.max_position_embeddings} positions")

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Embed one batch: int64 [B, L] inputs -> ``embedding`` float32 [B, hidden], unit L2 norm."""
        runner = self._live_runner()
        self._validate(feeds)
        return {"embedding": runner.run(feeds)}

    def infer_eager(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The same batch without graphs or padding (the reference for graph numerics); checked as :meth:`infer`."""
        batch = check_feeds(self, feeds)
        runner = self._live_runner()
        self._validate(feeds)
        return check_outputs(self, {"embedding": runner.run_eager(feeds)}, batch)

    @property
    def closed(self) -> bool:
        return self.runner is None

    def close(self) -> None:
        """Release the graphs, buffers and weights on the device (idempotent): a closed engine that something
        still references (the version it served) then holds no device memory."""
        if self.runner is not None:
            self.runner.close()
            self.runner = None
            self.model = None

