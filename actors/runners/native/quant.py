"""Weight-only quantization of the native model's linear layers, chosen per batch size.

Owns: turning a loaded model's bf16 matrices into int8 (per output channel) or int4 (per group
of 32 along K, asymmetric) at load time, and `QuantLinear`, the model's `linear` that picks
the kernel by the number of rows.

Why per row count: a decode step reads every weight once; at a few rows that read is the step
(bandwidth bound), so fewer bytes win: aten's `_weight_int8pack_mm` ran one SmolLM2 step's 211
products 3.4x faster than bf16 `F.linear` at 1 row, but 0.52x at 32 rows, where the products
are compute bound and the dequantizing kernel is slower than oneDNN's bf16 GEMM. So the bf16
matrices stay loaded beside the quantized ones and steps with more than `max_rows` rows use
them: memory is 1.5x (int8) or 1.25x (int4) the bf16 weights.

The quantized kernels take activations in bf16 (int8: any float dtype); scales are kept in the
activations' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

INT4_GROUP = 32
INT4_INNER_K_TILES = 2
# Rows up to which the quantized kernel beats bf16 F.linear, measured over one SmolLM2 step's
# 121 products (bf16, 1 thread, this EPYC; ops/bench/README.md "Quantization" has the table):
# int8 1.86x at 1 row, 1.08x at 8, 0.73x at 16; int4 4.47x at 1, 2.01x at 8, 1.17x at 16, 0.75x at 32.
MAX_ROWS = {8: 8, 4: 16}


@dataclass(slots=True)
class QuantizedWeight:
    dense: torch.Tensor  # [N, K] the original matrix, for steps past max_rows
    packed: torch.Tensor  # int8 [N, K], or int4 packed by aten for the CPU kernel
    scales: torch.Tensor  # int8: [N]; int4: [K / group, N, 2] scales and zeros
    bits: int

    @property
    def shape(self) -> torch.Size:
        return self.dense.shape


def quantize_int8(w: torch.Tensor) -> QuantizedWeight:
    """Symmetric per-output-channel int8: w ≈ q * scale, q in [-127, 127]."""
    wf = w.float()
    scales = wf.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(wf / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(dense=w, packed=q.contiguous(), scales=scales.to(w.dtype), bits=8)


def quantize_int4(w: torch.Tensor) -> QuantizedWeight:
    """Asymmetric int4 per group of INT4_GROUP input columns (the layout aten's CPU kernel reads:
    w ≈ (q - 8) * scale + zero, with zero = min + 8 * scale)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((hi - lo) / 15.0).clamp(min=1e-8)
    zeros = lo + scales * 8.0
    q = torch.round((groups - lo[..., None]) / scales[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INT4_INNER_K_TILES)
    scale_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(w.dtype)  # [K/g, N, 2]
    return QuantizedWeight(dense=w, packed=packed, scales=scale_zeros, bits=4)


class QuantLinear:
    """The model's `linear`: quantized kernels up to `max_rows` rows, the dense matrix past them."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(weight, QuantizedWeight):
            return F.linear(x, weight, bias)
        if x.shape[0] > self.max_rows:
            return F.linear(x, weight.dense, bias)
        if weight.bits == 8:
            out = torch.ops.aten._weight_int8pack_mm(x, weight.packed, weight.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight.packed, INT4_GROUP, weight.scales)
        return out if bias is None else out + bias


def quantize_model(weights, bits: int) -> None:
    """Replace every linear matrix (and the lm_head) of a loaded ModelWeights in place."""
    quantize = quantize_int8 if bits == 8 else quantize_int4
    for layer in weights.layers:
        for name in ("qkv", "o_proj", "gate_up", "down"):
            setattr(layer, name, quantize(getattr(layer, name)))
    weights.lm_head = quantize(weights.lm_head)
