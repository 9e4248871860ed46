"""The Llama-family forward on the row-invariant kernels: the CPU's default native step.

Owns: `RowwiseModel`, the decoder of llama.py with every op on kernels/ (products with their
bias, SwiGLU and residual add fused, norms, rotary, attention) but the embedding lookup, and `pack_weights`, which packs a loaded checkpoint's matrices for those kernels:
the dense weights in bf16, or the blocks a GGUF shipped (Q4_1, Q8_0) as they are.

Why: every row's arithmetic is fixed by that row alone (kernels/build.py's C files say how),
so a position's logits are the same bits decoded alone, beside other streams, as a draft's
verify row, after a prefix-cache hit or as a prompt chunk's last token. Drafting then changes
no token, a warm cache no logprob, and the time budget's chunk boundaries nothing at all. The
logits come out in float32 (the lm_head's sums, unrounded). A decoder's layers run as one
C call (kernels/stack.c, `ops.Stack`), the same kernels in the same order as layer by layer.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from actors.runners.native import shipped
from actors.runners.native.config import NativeConfig
from actors.runners.native.kernels import ops
from actors.runners.native.llama import rope_tables
from actors.runners.native.loader import ModelWeights
from actors.runners.native.lora import Adapters

_LINEARS = ("qkv", "o_proj", "gate_up", "down")
_BIASES = {"qkv": "qkv_bias", "o_proj": "o_bias"}


def pack_weights(weights: ModelWeights, model_dir: Path, tied: bool, blocks: bool, keep_dense: bool = True, swiglu: bool = True) -> Counter[str]:
    """Each linear matrix (and the lm_head) of `weights` replaced, in place, by its packed form:
    the checkpoint's own blocks where `blocks` and it ships them (with their bf16 upcast beside
    them for wide calls, `keep_dense`), else the dense matrix in bf16; gate/up with SwiGLU
    fused into the product unless not `swiglu` (LoRA adds to gate and up first). How many
    matrices each format serves."""
    shipped_blocks, types = shipped.read_blocks(model_dir) if blocks else ({}, {})
    prefix = "model." if any(name.startswith("model.") for name in types) else ""
    served: Counter[str] = Counter()

    def pack(holder: object, attr: str, names: list[str], bias: torch.Tensor | None) -> None:
        dense = getattr(holder, attr)
        kinds = {types.get(n) for n in names}
        if kinds == {"q4_1"}:
            q = torch.cat([shipped.unpack_nibbles(shipped_blocks[f"{n}.q4_1.qs"]) for n in names])
            d = torch.cat([shipped_blocks[f"{n}.q4_1.d"] for n in names])
            m = torch.cat([shipped_blocks[f"{n}.q4_1.m"] for n in names])
            packed, kind = ops.pack_q4_1(q, d, m, bias), "q4_1"
            if keep_dense:  # wide calls: the blocks' own values (d q + m in float32), bf16 as the kernel rounds them
                packed.dense = ops.pack_dense(_per_block(d) * q.float() + _per_block(m), bias)
        elif kinds == {"q8_0"} and len(names) == 1:
            q8, d = shipped_blocks[f"{names[0]}.q8_0.qs"], shipped_blocks[f"{names[0]}.q8_0.d"]
            packed, kind = ops.pack_q8_0(q8, d, bias), "q8_0"
            if keep_dense:
                packed.dense = ops.pack_dense(_per_block(d) * q8.float(), bias)
        else:
            packed, kind = ops.pack_dense(dense, bias), "dense"
        served[kind] += 1
        setattr(holder, attr, ops.as_swiglu(packed) if swiglu and attr == "gate_up" and packed.n % 32 == 0 else packed)

    for i, layer in enumerate(weights.layers):
        for attr in _LINEARS:
            parts = shipped.LINEARS[attr]
            pack(layer, attr, [f"{prefix}layers.{i}.{part}.weight" for part in parts], getattr(layer, _BIASES[attr]) if attr in _BIASES else None)
    head = f"{prefix}embed_tokens.weight" if tied or "lm_head.weight" not in types else "lm_head.weight"
    pack(weights, "lm_head", [head], None)
    return served


def _per_block(s: torch.Tensor) -> torch.Tensor:
    """Per-block scales [N, K / 32] as float32 [N, K]."""
    return s.float().repeat_interleave(32, dim=1)


class RowwiseModel:
    """Packed weights plus the forward; one instance per served model, driven from one thread."""

    def __init__(self, cfg: NativeConfig, weights: ModelWeights, max_len: int, window: int = 0) -> None:
        self.cfg = cfg
        self.w = weights
        self.window = window
        self.scale = cfg.head_dim**-0.5
        self.cos, self.sin = rope_tables(cfg, max_len, torch.float32, torch.device("cpu"))
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.adapters: Adapters | None = None  # LoRA (lora.py): each layer through `_adapted`
        # The layers in one kernel call (ops.Stack; None for a gate_up that is not a SwiGLU pair):
        # the packed weights' and, for steps of DENSE_ROWS rows or more, the dense copies' (as
        # `ops.linear` picks them).
        self.stacks = [ops.Stack.of(weights.layers, cfg.hidden_size, self.q_size, dense) for dense in (False, True)]

    def forward(
        self, input_ids: torch.Tensor, step: ops.RowStep, keep: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
    ) -> torch.Tensor:
        """input_ids `[T]` → float32 logits `[len(keep), V]` for the packed step's rows `keep`."""
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        h = F.embedding(input_ids, self.w.embed)  # the residual stream, updated in place
        stack = self.stacks[h.shape[0] >= ops.DENSE_ROWS] if self.adapters is None else None
        if stack is not None:
            stack(h, step, cfg.num_heads, cfg.num_kv_heads, self.cos, self.sin, k_cache, v_cache, eps, self.scale, self.window)
        else:
            for i, layer in enumerate(self.w.layers):
                if self.adapters is not None:
                    self._adapted(h, i, layer, step, k_cache[i], v_cache[i], self.adapters)
                    continue
                qkv = ops.linear(h, layer.qkv, norm=layer.input_norm, eps=eps)
                if layer.q_norm is not None and layer.k_norm is not None:
                    qkv = self._qk_norm(qkv, layer.q_norm, layer.k_norm)
                o = ops.rope_attention(qkv, cfg.num_heads, cfg.num_kv_heads, self.cos, self.sin, step, k_cache[i], v_cache[i], self.scale, self.window)
                ops.linear(o.view(-1, self.q_size), layer.o_proj, residual=h)
                if layer.gate_up.swiglu:
                    mlp = ops.linear(h, layer.gate_up, norm=layer.post_norm, eps=eps)
                else:
                    mlp = ops.silu_mul(ops.linear(h, layer.gate_up, norm=layer.post_norm, eps=eps))
                ops.linear(mlp, layer.down, residual=h)
        return ops.linear(h[keep], self.w.lm_head, out_f32=True, norm=self.w.final_norm, eps=eps)

    def _adapted(self, h: torch.Tensor, i: int, layer: Any, step: ops.RowStep, k_cache: torch.Tensor, v_cache: torch.Tensor, lora: Adapters) -> None:
        """Layer `i` with each row's LoRA adapter added to its products by the kernels'
        `lora_add` (the norms apart from the products, SwiGLU after the adapter's gate and up):
        every row, an adapter's too, stays row-invariant. Updates `h` in place."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        x = ops.rmsnorm(h, layer.input_norm, eps)
        qkv = ops.linear(x, layer.qkv)
        lora.add_into(qkv, x, i, "qkv")
        if layer.q_norm is not None and layer.k_norm is not None:
            qkv = self._qk_norm(qkv, layer.q_norm, layer.k_norm)
        o = ops.rope_attention(qkv, cfg.num_heads, cfg.num_kv_heads, self.cos, self.sin, step, k_cache, v_cache, self.scale, self.window).view(-1, self.q_size)
        ops.linear(o, layer.o_proj, residual=h)
        lora.add_into(h, o, i, "o_proj")
        x = ops.rmsnorm(h, layer.post_norm, eps)
        gate_up = ops.linear(x, layer.gate_up)
        lora.add_into(gate_up, x, i, "gate_up")
        mlp = ops.silu_mul(gate_up)
        ops.linear(mlp, layer.down, residual=h)
        lora.add_into(h, mlp, i, "down")

    def _qk_norm(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor) -> torch.Tensor:
        """Qwen3: RMSNorm over each head of q and k, before rotary."""
        d, eps = self.cfg.head_dim, self.cfg.rms_norm_eps
        q = ops.rmsnorm(qkv[:, : self.q_size].reshape(-1, d), q_norm, eps).view(-1, self.q_size)
        k = ops.rmsnorm(qkv[:, self.q_size : self.q_size + self.kv_size].reshape(-1, d), k_norm, eps).view(-1, self.kv_size)
        return torch.cat([q, k, qkv[:, self.q_size + self.kv_size :]], dim=1)
