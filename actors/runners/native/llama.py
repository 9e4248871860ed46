"""The Llama family (Llama, Mistral, Qwen2, Qwen3), as families.py registers it.

Owns: what of a config it cannot run (`refusal`), its checkpoint's names for a layer
(`layer_weights`), and its forward (`Model.step`, the one every step runs: eager, compiled,
CUDA graphs, differing only in the attention they pass): token embedding, per layer RMSNorm →
fused qkv (optional biases, optional Qwen3 per-head q/k RMSNorm) → rotary → attention → o_proj
→ RMSNorm → fused gate/up → SwiGLU → down, then the final norm and lm_head on the kept rows.

Plain functions over plain tensors (no nn.Module tree, no hooks): the whole step is a few
hundred aten calls, against ~6,200 for transformers' modules. Numerics follow transformers
op for op (RMSNorm in float32 and cast back before the weight; cos/sin computed in float32 and
cast to the activations' dtype), so float32 greedy output matches `generate` token for token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from actors.runners.native.attention import NativeStep, attend
from actors.runners.native.config import NativeConfig, rope_parameters
from actors.runners.native.loader import LayerWeights, ModelWeights, Take
from actors.runners.native.lora import Adapters

ROWWISE = True  # the row-invariant CPU kernels (rowwise.py) compute this family's forward
# A layer's attention as a step runs it: (layer index, q [T, H, d], k and v [T, KVH, d]) → [T, H, d].
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def refusal(hf: Any) -> str | None:
    """What of this config the family's forward does not compute (None: it runs it exactly)."""
    if getattr(hf, "hidden_act", "silu") != "silu":
        return f"hidden_act {hf.hidden_act!r} (native: silu)"
    if getattr(hf, "mlp_bias", False):
        return "mlp_bias"
    return None


def rope_tables(cfg: NativeConfig, length: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[length, head_dim]` for positions 0..length-1, as transformers computes them."""
    rope_type = rope_parameters(cfg.hf).get("rope_type", "default")
    if rope_type == "default":
        base = rope_parameters(cfg.hf).get("rope_theta", getattr(cfg.hf, "rope_theta", 10000.0))
        dim = cfg.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        scaling = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg.hf, torch.device("cpu"))
    freqs = torch.arange(length, dtype=torch.float)[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(device=device, dtype=dtype), (emb.sin() * scaling).to(device=device, dtype=dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaModel:
    """Weights plus the forward; one instance per served model, driven from one thread."""

    def __init__(self, cfg: NativeConfig, weights: ModelWeights, max_len: int) -> None:
        self.cfg = cfg
        self.w = weights
        self.scale = cfg.head_dim**-0.5
        self.cos, self.sin = rope_tables(cfg, max_len, weights.embed.dtype, weights.embed.device)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # Linear layers, swappable at load time (quantized or fixed-block variants take
        # (x, layer weights, name) and return x @ W^T).
        self.linear = _plain_linear
        self.adapters: Adapters | None = None  # LoRA adapters, each on its requests' rows (lora.py)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        step: NativeStep,
        keep: torch.Tensor,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
    ) -> torch.Tensor:
        """The eager step: input_ids, positions `[T]` → logits `[len(keep), V]` for the packed
        step's rows `keep`, its attention over the paged cache (attention.py)."""
        return self.step(input_ids, positions, lambda i, q, k, v: attend(q, k, v, k_cache[i], v_cache[i], step, self.scale), keep)

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attend, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The forward: embedding, every layer with `attention`, the final norm and lm_head of the
        rows `keep` (every row when None). The compiled graphs (decode_graph.py) and the CUDA
        graphs (cuda_graphs.py) trace this same function with attentions of their own."""
        h = F.embedding(input_ids, self.w.embed)
        cos = self.cos[positions][:, None, :]  # [T, 1, d]
        sin = self.sin[positions][:, None, :]
        for i, layer in enumerate(self.w.layers):
            q, k, v = self.pre_attention(h, layer, cos, sin)
            h = self.post_attention(h, attention(i, q, k, v), layer)
        h = rms_norm(h if keep is None else h[keep], self.w.final_norm, self.cfg.rms_norm_eps)
        return self.linear(h, self.w.lm_head, None)

    # The dense parts of a layer, on either side of its attention.

    def pre_attention(
        self, h: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Residual stream `[T, D]` → rotated q `[T, H, d]`, k and v `[T, KVH, d]`."""
        cfg = self.cfg
        tokens = h.shape[0]
        x = rms_norm(h, w.input_norm, cfg.rms_norm_eps)
        qkv = self._adapted(self.linear(x, w.qkv, w.qkv_bias), x, w, "qkv")
        q = qkv[:, : self.q_size].view(tokens, cfg.num_heads, cfg.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(tokens, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(tokens, cfg.num_kv_heads, cfg.head_dim)
        if w.q_norm is not None and w.k_norm is not None:
            q = rms_norm(q, w.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, w.k_norm, cfg.rms_norm_eps)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def post_attention(self, h: torch.Tensor, o: torch.Tensor, w: LayerWeights) -> torch.Tensor:
        """Attention output `[T, H, d]` → the layer's new residual stream `[T, D]`."""
        o = o.reshape(h.shape[0], self.q_size)
        h = h + self._adapted(self.linear(o, w.o_proj, w.o_bias), o, w, "o_proj")
        x = rms_norm(h, w.post_norm, self.cfg.rms_norm_eps)
        gate, up = self._adapted(self.linear(x, w.gate_up, None), x, w, "gate_up").chunk(2, dim=-1)
        act = F.silu(gate) * up
        return h + self._adapted(self.linear(act, w.down, None), act, w, "down")

    def _adapted(self, y: torch.Tensor, x: torch.Tensor, w: LayerWeights, module: str) -> torch.Tensor:
        return y if self.adapters is None else self.adapters.apply(y, x, w.index, module)


def _plain_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


Model = LlamaModel


def layer_weights(take: Take, i: int) -> LayerWeights:
    """Layer `i` of a transformers Llama-family checkpoint, fused as `Model` runs it."""
    p = f"layers.{i}."
    q, k, v = (take(p + f"self_attn.{n}_proj.weight") for n in "qkv")
    biases = [take(p + f"self_attn.{n}_proj.bias", required=False) for n in "qkv"]
    return LayerWeights(
        input_norm=take(p + "input_layernorm.weight"),
        qkv=torch.cat([q, k, v]),
        qkv_bias=_fused_bias(biases, i),
        q_norm=take(p + "self_attn.q_norm.weight", required=False),
        k_norm=take(p + "self_attn.k_norm.weight", required=False),
        o_proj=take(p + "self_attn.o_proj.weight"),
        o_bias=take(p + "self_attn.o_proj.bias", required=False),
        post_norm=take(p + "post_attention_layernorm.weight"),
        gate_up=torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]),
        down=take(p + "mlp.down_proj.weight"),
        index=i,
    )


def _fused_bias(biases: list[torch.Tensor | None], layer: int) -> torch.Tensor | None:
    present = [b is not None for b in biases]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"layer {layer}: q/k/v biases must be all present or all absent, found {present}")
    return torch.cat(biases)
