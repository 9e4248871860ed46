"""Quantized linear layers of the native model, with the kernel chosen per batch size.

Owns: turning a loaded model's bf16 matrices into int8 (per output channel) or int4 (per group
of 32 along K, asymmetric) at load time, and `QuantLinear`, the model's `linear` that picks
the kernel by the number of rows.

Why per row count: a decode step of few rows reads every weight once, so that read is the step
(bandwidth bound) and fewer bytes win: aten's weight-only kernels. Past a few rows the products
are compute bound and those kernels, which dequantize every weight for every row block, lose to
a bf16 GEMM; there the activations are quantized too, per row, and the product runs as an int8
GEMM (`torch._int_mm`), rescaled by the row and channel scales. So prompt chunks and wide decode
steps gain as well, and no bf16 copy of the weights stays loaded (measurements: the comments
beside `MAX_ROWS`, `QuantLinear` and `quantize_model`).

Before quantizing, the linears are smoothed for the int8 GEMM (smoothing.py); int4 smooths only
its int8 matrix (`QuantizedWeight.smooth`). Quality against bf16: docs/performance.md
("Quantization"). The weight-only kernels take activations in bf16 (int8: any float dtype);
their scales are kept in the activations' dtype. The int8 GEMM's scales are float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

INT4_GROUP = 32
INT4_INNER_K_TILES = 2
# Rows up to which the weight-only kernel beats the int8 GEMM: one layer's four products, 2
# threads, this EPYC (time against bf16 F.linear, weight-only / int8 GEMM): 1 row 0.56 / 0.70,
# 4 rows 0.88 / 1.01 (int4 0.85 / 1.09), 8 rows 1.24 / 0.85 (int4 1.16 / 0.60), 32 rows
# 1.95 / 0.73. Against bf16 alone the limits had been 8 (int8) and 16 (int4) rows.
MAX_ROWS = {8: 4, 4: 4}


@dataclass(slots=True)
class QuantizedWeight:
    packed: torch.Tensor  # the weight-only kernel's operand: int8 [N, K], or int4 packed by aten
    scales: torch.Tensor  # its scales: int8 [N]; int4 [K / group, N, 2] scales and zeros
    bits: int
    int8: torch.Tensor  # int8 [N, K] per output channel, for the int8 GEMM (bits 8: `packed` itself)
    int8_scales: torch.Tensor  # float32 [N]
    # 1 / s [K] in the weight's dtype, when the int8 matrix alone holds W * s (int4: see
    # smoothing.py); the int8 GEMM multiplies the activations by it. None: no smoothing, or
    # smoothing folded into the weights (int8).
    smooth: torch.Tensor | None = None
    # The int4 pack spans the input twice (shipped.py: 8-bit quants as high and low nibbles):
    # the weight-only kernel reads [x, x].
    doubled: bool = False
    # The dense matrix in the activations' dtype, when kept for steps past `QuantLinear.dense_rows`
    # (shipped.py, on CPUs whose bf16 GEMM beats the int8 GEMM there). None: not kept.
    dense: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.int8.shape


def _int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: w ≈ q * scale, q in [-127, 127]; scale float32 [N]."""
    wf = w.float()
    scales = wf.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    return torch.round(wf / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scales


def quantize_int8(w: torch.Tensor) -> QuantizedWeight:
    q, scales = _int8_per_channel(w)
    return QuantizedWeight(packed=q, scales=scales.to(w.dtype), bits=8, int8=q, int8_scales=scales)


def quantize_int4(w: torch.Tensor, smooth: torch.Tensor | None = None) -> QuantizedWeight:
    """Asymmetric int4 per group of INT4_GROUP input columns (the layout aten's CPU kernel reads:
    w ≈ (q - 8) * scale + zero, with zero = min + 8 * scale), plus the int8 matrix, of w * smooth
    when smoothing scales are given (the int4 pack stays unsmoothed: it lost 0.2-0.3 nats/token)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((hi - lo) / 15.0).clamp(min=1e-8)
    zeros = lo + scales * 8.0
    q = torch.round((groups - lo[..., None]) / scales[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
    return int4_weight(q, scales, zeros, w, smooth)


def int4_weight(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, w: torch.Tensor, smooth: torch.Tensor | None, doubled: bool = False) -> QuantizedWeight:
    """The int4 scheme's weight from quants q `[N, K]` (0..15) and per-group scales and zeros
    `[N, K / group]` (w = (q - 8) * scale + zero, aten's convention), its int8 matrix from the
    dense `w` (times `smooth` when given). Scales are kept in w's dtype, the activations'."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), INT4_INNER_K_TILES)
    scale_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(w.dtype)  # [K/g, N, 2]
    q8, scales8 = _int8_per_channel(w if smooth is None else w.float() * smooth)
    inverse = None if smooth is None else smooth.reciprocal().to(w.dtype)
    return QuantizedWeight(packed=packed, scales=scale_zeros, bits=4, int8=q8, int8_scales=scales8, smooth=inverse, doubled=doubled)


def int8_gemm(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """x [M, K] quantized per row (symmetric, dynamic) times the int8 weight, in x's dtype."""
    # One copy into float32 each side of the GEMM, then in-place passes: timed against
    # vector_norm / aminmax for the row maxima and out= / outer-product rescaling, this order
    # was the fastest at every prefill and decode shape (up to 2.5x less time around the GEMM).
    # Smoothing divides x by s in x's dtype (exact: s is a power of two), before the float32
    # copy: an abs/amax over the float32 copy instead ran up to 10x slower at 512 rows here.
    x = x if weight.smooth is None else x * weight.smooth
    row_scales = x.abs().amax(dim=-1, keepdim=True).float().clamp_(min=1e-8).div_(127.0)
    xq = x.to(torch.float32, copy=True).mul_(row_scales.reciprocal()).round_().to(torch.int8)  # |x / scale| <= 127
    acc = torch._int_mm(xq, weight.int8.t())  # int32 [M, N]
    return acc.float().mul_(row_scales).mul_(weight.int8_scales).to(x.dtype)


# aten's weight-only kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) ran one
# SmolLM2 step's products 1.9x (int8) and 4.5x (int4) faster than bf16 `F.linear` at 1 row; past
# a few rows they lose to oneDNN's bf16 GEMM (int8 0.73x at 16 rows). The int8 GEMM runs VNNI
# on x86: ~740 int8 GOP/s against ~330-375 bf16 GFLOP/s on an EPYC at prefill shapes. Memory is
# 0.5x (int8) or 0.75x (int4: the int4 pack plus the int8 matrix) the bf16 weights.
class QuantLinear:
    """The model's `linear`: the weight-only kernel up to `max_rows` rows, the int8 GEMM past them,
    and past `dense_rows` (when given) the dense matrix a weight keeps, if it keeps one."""

    def __init__(self, max_rows: int, dense_rows: int | None = None) -> None:
        self.max_rows = max_rows
        self.dense_rows = dense_rows

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(weight, QuantizedWeight):
            return F.linear(x, weight, bias)
        if self.dense_rows is not None and x.shape[0] > self.dense_rows and weight.dense is not None:
            return F.linear(x, weight.dense, bias)
        if x.shape[0] > self.max_rows:
            out = int8_gemm(x, weight)
        elif weight.bits == 8:
            out = torch.ops.aten._weight_int8pack_mm(x, weight.packed, weight.scales)
        else:
            x4 = torch.cat([x, x], dim=-1) if weight.doubled else x
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x4, weight.packed, INT4_GROUP, weight.scales)
        return out if bias is None else out + bias


# Smoothing (smoothing.py, SmoothQuant with alpha 0.5, calibrated at load): int8 folds the
# scales into the weights, so both kernels read the smoothed matrix; int4 smooths only its int8
# matrix, because folding into the int4 pack cost it 0.2-0.3 nats/token. Quality cost against
# bf16 (mean token logprob change / mean KL per token, nats; `python -m ops.bench.quant_quality`,
# SmolLM2-135M, AMD EPYC, ops/results/quant-quality-smoothing-2026-11-24-epyc-zen4.json), before
# -> after smoothing: int8 GEMM -0.054 / 0.041 -> -0.017 / 0.021 (both schemes); int8 weight-only
# -0.025 / 0.0067 -> -0.026 / 0.0088 (the fold's price: a second int8 matrix would avoid it at
# +0.5x the bf16 weights' memory); int4 weight-only -0.031 / 0.048, unchanged. Every kernel's
# speed is unchanged within noise (step_ab); loading takes ~0.4-1 s more (SmolLM2-135M).
def quantize_model(weights, bits: int, smooth: dict[int, torch.Tensor] | None = None) -> None:
    """Replace every linear matrix (and the lm_head) of a loaded ModelWeights in place; int4's
    int8 matrices smoothed by `smooth` (s per matrix, keyed by id(matrix)) when given."""

    def quantize(w: torch.Tensor) -> QuantizedWeight:
        return quantize_int8(w) if bits == 8 else quantize_int4(w, None if smooth is None else smooth[id(w)])

    for layer in weights.layers:
        for name in ("qkv", "o_proj", "gate_up", "down"):
            setattr(layer, name, quantize(getattr(layer, name)))
    weights.lm_head = quantize(weights.lm_head)
