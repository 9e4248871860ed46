"""The weights as shipped: a quantized checkpoint's own blocks served by the int4 kernel.

Owns: reading `shipped.safetensors` (runtime/gguf_blocks.py wrote it beside the dense
conversion) and turning its blocks into the `QuantizedWeight`s of `--quantization int4`, with
no requantization: `QuantLinear` then runs the same kernels (aten's int4 weight-only matvec up
to quant.MAX_ROWS[4] rows, the int8 GEMM past them).

Q4_1 is the int4 kernel's own layout, so each block is carried exactly (`q4_1_weight`); Q8_0
(llama.cpp keeps the token embedding at Q8_0 in its Q4_1 files) is carried exactly by the same
kernel over the input twice (`q8_0_weight`). Tensors the checkpoint keeps at other precisions
(F32 norms, any other block type) stay dense, read as converted.

The int8 GEMM's matrices (steps past the row limit) come from the dense upcast, per output
channel and smoothed, as `--quantization int4` makes them (quant.py). On a CPU with AMX the
dense upcast is kept too, and steps past AMX_DENSE_PAST_ROWS rows run oneDNN's bf16 GEMM on it
instead (`QuantLinear.dense_rows`), the faster there; without AMX the int8 GEMM was the faster
at every prefill shape, so the dense copy is not kept. Figures:
ops/results/performance-history-2026-11-22-to-27.md, "The weights as shipped".
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from actors.runners.native.quant import QuantizedWeight, int4_weight
from runtime.gguf_blocks import SHIPPED_FILE

SCHEME = "shipped"
# On a CPU with AMX the int8 GEMM (`torch._int_mm`) took 1.09x bf16's time for one layer's four
# products at 8 rows, 1.36x at 32, 1.74x at 128 (2 threads, Xeon with AMX, 2026-11-26), and a
# 128-token prefill step with it 1.2x (ops/results/performance-history-2026-11-22-to-27.md, "The
# weights as shipped"); decode steps of 8-32 rows still gained from it (the lm_head reads half the
# bytes). The step's speed with the int8 GEMM against bf16 there: decode of 32 rows 1.04x, 64 rows
# 0.94x, 128-token prefill 0.84x.
AMX_DENSE_PAST_ROWS = 32
LINEARS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}


def ships_blocks(model_dir: Path) -> bool:
    return (model_dir / SHIPPED_FILE).is_file()


def dense_past_rows(device: torch.device) -> int | None:
    """Rows past which steps run the kept dense matrices (None: the int8 GEMM at every width)."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return AMX_DENSE_PAST_ROWS if device.type == "cpu" and amx is not None and amx() else None


def read_blocks(model_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The stored arrays and each stored tensor's block format ("q4_1" | "q8_0")."""
    from safetensors import safe_open

    with safe_open(str(model_dir / SHIPPED_FILE), framework="pt") as f:
        types = json.loads((f.metadata() or {})["types"])
        return {key: f.get_tensor(key) for key in f.keys()}, types


def unpack_nibbles(pairs: torch.Tensor) -> torch.Tensor:
    """uint8 `[N, K / 2]` of two quants each (column 2j low) -> int32 `[N, K]`."""
    return torch.stack([pairs & 0x0F, pairs >> 4], dim=-1).reshape(pairs.shape[0], -1).to(torch.int32)


# Q4_1 (w = d * q + m per block of 32) is the int4 kernel's own layout: aten computes
# w = (q - 8) * scale + zero per group of 32 along K, so scale = d and zero = m + 8 d carry each
# block exactly; only d and the zero are rounded to the activations' dtype (bf16: 8 significant
# bits, as the dense upcast rounds every weight). q/k/v and gate/up are fused by stacking rows.
def q4_1_weight(blocks: dict[str, torch.Tensor], names: list[str], dense: torch.Tensor, smooth: torch.Tensor | None) -> QuantizedWeight:
    """The Q4_1 tensors `names`, stacked by rows (the fused matrix `dense`), as the int4 pack."""
    q = torch.cat([unpack_nibbles(blocks[f"{n}.q4_1.qs"]) for n in names])
    d = torch.cat([blocks[f"{n}.q4_1.d"] for n in names]).float()
    m = torch.cat([blocks[f"{n}.q4_1.m"] for n in names]).float()
    return int4_weight(q, d, m + 8.0 * d, dense, smooth)


# Q8_0 (w = d * q, q int8, per block of 32; SmolLM2 ties the token embedding to the lm_head) has
# no block-scaled int8 kernel in aten. It is carried exactly by the same int4 kernel over the
# input twice: q = 16 hi + lo with hi in -8..7 and lo in 0..15, the first K columns hold hi + 8
# with scale 16 d and zero 0, the last K columns lo with scale d and zero 8 d, and the kernel
# reads [x, x] (`QuantizedWeight.doubled`): the int8 matrix's bytes plus the scales, ~0.6x the
# bf16 matrix's; an int4 requantization of this lm_head cost 0.046 nats/token of KL alone (0.048
# against 0.0021 with a bf16 lm_head: ops/results/performance-history-2026-11-22-to-27.md, "The
# weights as shipped").
def q8_0_weight(blocks: dict[str, torch.Tensor], name: str, dense: torch.Tensor, smooth: torch.Tensor | None) -> QuantizedWeight:
    """The Q8_0 tensor `name` as an int4 pack over [x, x]: high nibbles, then low."""
    q = blocks[f"{name}.q8_0.qs"].to(torch.int32)
    d = blocks[f"{name}.q8_0.d"].float()
    hi = torch.div(q, 16, rounding_mode="floor")
    lo = q - 16 * hi
    scales = torch.cat([16.0 * d, d], dim=1)
    zeros = torch.cat([torch.zeros_like(d), 8.0 * d], dim=1)
    return int4_weight(torch.cat([hi + 8, lo], dim=1), scales, zeros, dense, smooth, doubled=True)


def _weight(blocks, types, names: list[str], dense: torch.Tensor, smooth: torch.Tensor | None) -> QuantizedWeight | None:
    kinds = {types.get(n) for n in names}
    if kinds == {"q4_1"}:
        return q4_1_weight(blocks, names, dense, smooth)
    if kinds == {"q8_0"} and len(names) == 1:
        return q8_0_weight(blocks, names[0], dense, smooth)
    return None  # another precision (or a mix): stays dense


def quantize_model(weights, model_dir: Path, tied: bool, smooth: dict[int, torch.Tensor] | None, keep_dense: bool = False) -> Counter[str]:
    """Replace the loaded ModelWeights' linears (and lm_head) that the checkpoint ships in
    blocks, in place; the int8 matrices smoothed by `smooth` (keyed by id(matrix)) when given;
    each keeping its dense matrix when `keep_dense`. Returns how many matrices each block
    format now serves ("dense" for the others)."""
    blocks, types = read_blocks(model_dir)
    prefix = "model." if any(name.startswith("model.") for name in types) else ""
    served: Counter[str] = Counter()

    def replace(holder, attr: str, names: list[str]) -> None:
        dense = getattr(holder, attr)
        new = _weight(blocks, types, names, dense, None if smooth is None else smooth[id(dense)])
        served[types[names[0]] if new is not None else "dense"] += 1
        if new is not None:
            new.dense = dense if keep_dense else None
            setattr(holder, attr, new)

    for i, layer in enumerate(weights.layers):
        for attr, parts in LINEARS.items():
            replace(layer, attr, [f"{prefix}layers.{i}.{part}.weight" for part in parts])
    head = f"{prefix}embed_tokens.weight" if tied or "lm_head.weight" not in types else "lm_head.weight"
    replace(weights, "lm_head", [head])
    return served


def describe(served: Counter[str]) -> str:
    """The impl suffix: the block format serving most matrices ("q4_1")."""
    return max((n, kind) for kind, n in served.items() if kind != "dense")[1] if set(served) - {"dense"} else "dense"
