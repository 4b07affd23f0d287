"""all-MiniLM-L6-v2 in plain PyTorch: BERT encoder + mean pooling + L2 normalization.

No ``transformers`` at serve time: the python-backend stub runs with numpy 1.x, where
``transformers`` fails to import. The math follows Hugging Face
``BertModel`` (post-LayerNorm encoder, exact-erf GELU, absolute position embeddings) and
sentence-transformers' ``Pooling(mean)`` + ``Normalize``:

    x      = LayerNorm(word[ids] + position[0..L) + token_type[types])
    layer: a = LayerNorm(x + Wo . Attention(Wqkv . x))        # Q, K, V projections fused in one GEMM
           x = LayerNorm(a + W2 . gelu(W1 . a))
    mean   = sum_t(x_t * mask_t) / max(sum_t mask_t, 1e-9)          # in float32
    out    = mean / max(||mean||_2, 1e-12)                          # float32 [B, hidden]

Attention is ``torch.nn.functional.scaled_dot_product_attention`` with a boolean key mask, so
padding tokens never contribute to a real token's result: a text's embedding does not depend on
its batch neighbours.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from fastpath.engines.torch.fp8 import Fp8Weight, fp8_linear
from fastpath.errors import ArtifactError


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig:
    """BERT hyperparameters (Hugging Face ``config.json`` names); defaults are all-MiniLM-L6-v2's."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> BertConfig:
        """Build from string metadata (safetensors header); unknown keys are ignored."""
        values = {}
        for field in dataclasses.fields(cls):
            if field.name in metadata:
                values[field.name] = float(metadata[field.name]) if field.type in (float, "float") else int(metadata[field.name])
        return cls(**values)

    def to_metadata(self) -> dict[str, str]:
        """String metadata for a safetensors header."""
        return {key: str(value) for key, value in dataclasses.asdict(self).items()}


def _linear(x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor) -> torch.Tensor:
    if isinstance(weight, Fp8Weight):
        return fp8_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class BertEmbedder:
    """The model as a set of tensors and a forward function (no ``nn.Module`` machinery needed).

    Args:
        config: hyperparameters.
        weights: Hugging Face ``BertModel`` state dict names (``embeddings.*``, ``encoder.layer.N.*``),
            any float dtype, any device.
        dtype: compute dtype (``torch.float16``, ``torch.bfloat16`` or ``torch.float32``).
        device: where the model runs.
        fp8: store the encoder's linear weights as float8 e4m3 with per-output-channel scales and
            run them through ``torch._scaled_mm`` (Hopper); activations are scaled per tensor.

    Raises:
        ArtifactError: a weight is missing or has the wrong shape (message names it).
    """

    def __init__(
        self,
        config: BertConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str = "cpu",
        fp8: bool = False,
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.fp8 = fp8
        hidden = config.hidden_size
        self.head_dim = hidden // config.num_attention_heads

        def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            if name not in weights:
                raise ArtifactError(f"weight {name!r} is missing from the model file")
            tensor = weights[name]
            if tuple(tensor.shape) != shape:
                raise ArtifactError(f"weight {name!r} has shape {tuple(tensor.shape)}; expected {shape} for {config}")
            return tensor.to(device=self.device, dtype=dtype).contiguous()

        def weight(w: torch.Tensor) -> torch.Tensor | Fp8Weight:
            return Fp8Weight.quantize(w) if fp8 else w

        e = "embeddings."
        self.word = take(e + "word_embeddings.weight", (config.vocab_size, hidden))
        self.position = take(e + "position_embeddings.weight", (config.max_position_embeddings, hidden))
        self.token_type = take(e + "token_type_embeddings.weight", (config.type_vocab_size, hidden))
        self.embedding_norm = (take(e + "LayerNorm.weight", (hidden,)), take(e + "LayerNorm.bias", (hidden,)))
        self.layers = []
        for index in range(config.num_hidden_layers):
            p = f"encoder.layer.{index}."
            qkv = [take(p + f"attention.self.{n}.weight", (hidden, hidden)) for n in ("query", "key", "value")]
            qkv_bias = [take(p + f"attention.self.{n}.bias", (hidden,)) for n in ("query", "key", "value")]
            self.layers.append({
                "qkv": (weight(torch.cat(qkv)), torch.cat(qkv_bias)),
                "attention_out": (weight(take(p + "attention.output.dense.weight", (hidden, hidden))), take(p + "attention.output.dense.bias", (hidden,))),
                "attention_norm": (take(p + "attention.output.LayerNorm.weight", (hidden,)), take(p + "attention.output.LayerNorm.bias", (hidden,))),
                "up": (weight(take(p + "intermediate.dense.weight", (config.intermediate_size, hidden))), take(p + "intermediate.dense.bias", (config.intermediate_size,))),
                "down": (weight(take(p + "output.dense.weight", (hidden, config.intermediate_size))), take(p + "output.dense.bias", (hidden,))),
                "output_norm": (take(p + "output.LayerNorm.weight", (hidden,)), take(p + "output.LayerNorm.bias", (hidden,))),
            })

    def _norm(self, x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(x, (self.config.hidden_size,), params[0], params[1], self.config.layer_norm_eps)

    def _attention(self, x: torch.Tensor, layer: dict, key_mask: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        heads = self.config.num_attention_heads
        qkv = _linear(x, *layer["qkv"]).view(batch, length, 3, heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, L, head_dim]
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, scale=1.0 / math.sqrt(self.head_dim))
        return _linear(context.transpose(1, 2).reshape(batch, length, hidden), *layer["attention_out"])

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """Last hidden state.

        Args:
            input_ids, attention_mask, token_type_ids: int [B, L] on ``device``; L <= max_position_embeddings.

        Returns:
            [B, L, hidden] in the compute dtype.
        """
        length = input_ids.shape[1]
        x = F.embedding(input_ids, self.word) + self.position[:length] + F.embedding(token_type_ids, self.token_type)
        x = self._norm(x, self.embedding_norm)
        key_mask = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, L]: True = attend
        for layer in self.layers:
            x = self._norm(x + self._attention(x, layer, key_mask), layer["attention_norm"])
            x = self._norm(x + _linear(F.gelu(_linear(x, *layer["up"])), *layer["down"]), layer["output_norm"])
        return x

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings: float32 [B, hidden], unit L2 norm (mean over ``attention_mask``)."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids).float()
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(mean, p=2.0, dim=1, eps=1e-12)
