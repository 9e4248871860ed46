"""SmoothQuant-style smoothing of the native model's linears before they are quantized.

Owns: calibrating each linear's per-input-channel activation maxima from one bf16 forward of
CALIBRATION_TEXT, and folding the smoothing scales into the weights:
s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha) (Xiao et al. 2022), X' = X / s, W' = W * s.

Why: the int8 GEMM quantizes activations per row, so one input channel far larger than the
rest (an "outlier" channel, common after RMSNorm) sets the row's step and flattens every other
channel to a few levels. Dividing that channel by s moves its range into the weight column,
which is quantized per output channel and has room for it.

int8 folds 1/s into the op before each linear (`fold`), so both of its kernels read the one
smoothed matrix; int4 keeps its pack unsmoothed and smooths only its separate int8 matrix, the
GEMM dividing x by s itself (quant.py). The calibration costs a tokenizer load and one forward
of ~200 tokens at load. Figures: docs/performance.md "Quantization"
(ops/results/quant-quality-smoothing-2026-11-24-epyc-zen4.json), the comments below and in quant.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

# Not the text ops/bench/quant_quality.py scores: calibrating on it would flatter the figures.
CALIBRATION_TEXT = """Dear Ms. Alvarez, thank you for your letter of 3 May. We have checked the
invoice and agree that the delivery charge of $48.50 was applied twice; a refund will reach your
account within five working days.

for (int i = 0; i < n; ++i) {
    sum += values[i] * weights[i];
}
printf("%d items, total %.2f\\n", n, sum);

The Amazon river carries more water than the next seven largest rivers combined. Its basin covers
about seven million square kilometres, and during the wet season parts of the forest flood to a
depth of ten metres. Fish there have adapted to eat fruit and seeds that fall from the trees.

User: How many minutes are in a week?
Assistant: 7 days x 24 hours x 60 minutes = 10,080 minutes."""

# Alpha 0.5 had the lowest KL against bf16 for the int8 GEMM among 0.4-0.8, on the evaluation
# text and on this calibration text alike. SmoothQuant's default; 0.4-0.8 measured (ops/results/quant-smoothing-alpha-sweep-2026-11-24-epyc-zen4.json,
# docs/performance.md "Quantization"). None: no smoothing.
ALPHA: float | None = 0.5


@contextmanager
def alpha_while_loading(alpha: float | None) -> Iterator[None]:
    """Models loaded inside the block smooth with `alpha` (None: not at all): the benchmarks'
    before/after (the served path always runs with ALPHA)."""
    global ALPHA
    kept, ALPHA = ALPHA, alpha
    try:
        yield
    finally:
        ALPHA = kept


class _MaximaRecorder:
    """The model's `linear` for the calibration forward: a dense product that keeps, per weight
    matrix, the largest |x| each input channel saw."""

    def __init__(self) -> None:
        self.maxima: dict[int, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        seen = x.abs().amax(dim=0).float()
        before = self.maxima.get(id(weight))
        self.maxima[id(weight)] = seen if before is None else torch.maximum(before, seen)
        return F.linear(x, weight, bias)


# The calibration costs a tokenizer load and one forward of ~200 tokens: 0.4-1 s at load for
# SmolLM2-135M on 2 cores.
def calibration_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)(CALIBRATION_TEXT)["input_ids"]


def calibrate(model, ids: list[int]) -> dict[int, torch.Tensor]:
    """One dense forward of `ids` (a throwaway cache of its own); maxima keyed by id(weight)."""
    from actors.runners.native.attention import build_step

    cfg, w = model.cfg, model.w
    ids = ids[: model.cos.shape[0]]  # within the rotary tables (--max-model-len may be short)
    block = 16
    blocks = -(-len(ids) // block)
    shape = (cfg.num_kv_heads, blocks * block, cfg.head_dim)
    k_cache = [torch.zeros(shape, dtype=w.embed.dtype, device=w.embed.device) for _ in w.layers]
    v_cache = [torch.zeros_like(c) for c in k_cache]
    recorder, linear = _MaximaRecorder(), model.linear
    model.linear = recorder
    try:
        with torch.inference_mode():
            step, positions = build_step([(0, len(ids))], [list(range(blocks))], block, k_cache, v_cache)
            model.forward(torch.tensor(ids, device=w.embed.device), positions, step, torch.arange(len(ids)), k_cache, v_cache)
    finally:
        model.linear = linear
    return recorder.maxima


def channel_scales(act_max: torch.Tensor, weight_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """s per input channel, float32, rounded to a power of two (exact to fold in bf16)."""
    s = act_max.clamp(min=1e-5).pow(alpha) / weight_max.clamp(min=1e-5).pow(1 - alpha)
    return torch.exp2(torch.log2(s).round())


def _column_max(weight: torch.Tensor) -> torch.Tensor:
    return weight.float().abs().amax(dim=0)


def smoothing_scales(model, maxima: dict[int, torch.Tensor], alpha: float) -> dict[int, torch.Tensor]:
    """s for every linear, keyed by id(weight) like `maxima`."""
    cfg, w = model.cfg, model.w
    per_group = (cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim)
    out = {}
    for layer in w.layers:
        for matrix in (layer.qkv, layer.gate_up, layer.down):
            out[id(matrix)] = channel_scales(maxima[id(matrix)], _column_max(matrix), alpha)
        # o_proj reads the attention output, a mix of v rows: one s per (kv head, dim), shared
        # by the q heads of the group, so that it can be folded into v
        o_act = maxima[id(layer.o_proj)].view(per_group).amax(dim=1)
        o_s = channel_scales(o_act, _column_max(layer.o_proj).view(per_group).amax(dim=1), alpha)
        out[id(layer.o_proj)] = o_s[:, None, :].expand(per_group).reshape(-1)
    out[id(w.lm_head)] = channel_scales(maxima[id(w.lm_head)], _column_max(w.lm_head), alpha)
    return out


def _times(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (t.float() * s).to(t.dtype)


# int8: folded, not applied at run time: 1/s goes into the op before each linear (the input
# RMSNorm weight for qkv, the post-attention norm for gate_up, the up rows of gate_up for down,
# the v rows of qkv for o_proj, the final norm for lm_head), so the kernels run unchanged and
# both of them, weight-only and GEMM, read the one smoothed matrix. Each s is rounded to a power
# of two, so both multiplications are exact in bf16 and the dense product is unchanged bit for
# bit. o_proj's input is the attention output, a mix of v rows per head: its scales are shared
# by the q heads of one kv group, since they all read the same v. A tied lm_head gets its own
# smoothed copy (quantized right after); the embedding lookup keeps the unsmoothed matrix.
# Folding suits int8 (its GEMM and weight-only kernel share one matrix) but not int4: the int4
# pack's groups of 32 columns took the inflated columns badly (-0.27 nats/token at alpha 0.5).
def fold(model, scales: dict[int, torch.Tensor]) -> None:
    """Fold every linear's smoothing into its weights and the op before it, in place."""
    cfg, w = model.cfg, model.w
    v_rows = slice(model.q_size + model.kv_size, None)
    for layer in w.layers:
        s, o_s = scales[id(layer.qkv)], scales[id(layer.o_proj)]
        gate_up_s, down_s = scales[id(layer.gate_up)], scales[id(layer.down)]
        v_s = o_s.view(cfg.num_kv_heads, -1, cfg.head_dim)[:, 0, :].reshape(-1)  # [KVH * d]
        layer.input_norm = _times(layer.input_norm, 1 / s)
        qkv = _times(layer.qkv, s)
        qkv[v_rows] = _times(qkv[v_rows], 1 / v_s[:, None])
        layer.qkv = qkv
        if layer.qkv_bias is not None:
            layer.qkv_bias = layer.qkv_bias.clone()
            layer.qkv_bias[v_rows] = _times(layer.qkv_bias[v_rows], 1 / v_s)
        layer.o_proj = _times(layer.o_proj, o_s)
        layer.post_norm = _times(layer.post_norm, 1 / gate_up_s)
        gate_up = _times(layer.gate_up, gate_up_s)
        up_rows = slice(gate_up.shape[0] // 2, None)
        gate_up[up_rows] = _times(gate_up[up_rows], 1 / down_s[:, None])
        layer.gate_up = gate_up
        layer.down = _times(layer.down, down_s)
    head_s = scales[id(w.lm_head)]
    w.final_norm = _times(w.final_norm, 1 / head_s)
    w.lm_head = _times(w.lm_head, head_s)  # a new tensor: a tied embedding stays as it was


def prepare(model, model_dir: Path, bits: int) -> dict[int, torch.Tensor] | None:
    """Calibrate and smooth before quantizing: int8 folds (returns None), int4 returns the
    scales for the int8 GEMM's matrix alone (`quant.quantize_model`)."""
    if ALPHA is None:
        return None
    scales = smoothing_scales(model, calibrate(model, calibration_ids(model_dir)), ALPHA)
    if bits == 8:
        fold(model, scales)
        return None
    return scales
