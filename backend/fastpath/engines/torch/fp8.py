"""FP8 (e4m3) linear layers through ``torch._scaled_mm`` (Hopper tensor cores; also runs on CPU).

Weights are quantized once per tensor: ``scale_w = amax(|W|) / 448`` (448 is e4m3's largest
finite value). Activations are quantized on every call with a per-tensor scale computed on the
device (``amax(|x|) / 448``), so the layer stays capturable in a CUDA graph: no host
synchronization, no data-dependent shapes. ``y = (x_q @ W_q^T) * scale_x * scale_w + b``.

Reference: "FP8 Formats for Deep Learning" (Micikevicius et al., 2022) for e4m3 and per-tensor
scaling; PyTorch ``torch._scaled_mm`` wants the second operand column-major (a transposed
row-major weight) and inner dimensions that are multiples of 16.
"""

from __future__ import annotations

import dataclasses

import torch

E4M3_MAX = 448.0


@dataclasses.dataclass(frozen=True)
class Fp8Weight:
    """A linear layer's weight in float8 e4m3 with its per-tensor scale.

    Attributes:
        data: float8_e4m3fn [out_features, in_features], row-major.
        scale: float32 0-d tensor, ``amax(|W|) / 448``; ``W ~= data * scale``.
    """

    data: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Fp8Weight:
        """Quantize a [out, in] weight (any float dtype) per tensor."""
        scale = weight.detach().abs().amax().float().clamp(min=1e-12) / E4M3_MAX
        data = (weight.detach().float() / scale).to(torch.float8_e4m3fn).contiguous()
        return cls(data, scale.reshape(()))

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def fp8_linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W^T + b`` with x and W in e4m3; the result has x's dtype.

    Args:
        x: [..., in_features], float16/bfloat16/float32.
        weight: the quantized weight.
        bias: [out_features] in x's dtype, or None.
    """
    flat = x.reshape(-1, x.shape[-1])
    scale = flat.abs().amax().float().clamp(min=1e-12) / E4M3_MAX
    quantized = (flat / scale.to(flat.dtype)).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(quantized, weight.data.t(), scale_a=scale, scale_b=weight.scale, out_dtype=x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], out.shape[-1])
