"""The native model families, as a registry: which architectures run natively, and by what.

Owns `ARCHITECTURES` (a transformers architecture → its family's module and variant, as vLLM's
model registry maps one), `check()` (whether the native path runs a checkpoint exactly, and
why not) and `native_config()`. A family module (today `llama`: Llama, Mistral, Qwen2, Qwen3)
gives `refusal(hf)` (what of a config it cannot run), `layer_weights(take, i)` (the
checkpoint's names for a layer, fused as it runs them) and `Model`, whose `step` is the one
forward the eager, compiled and CUDA-graph steps all run. Adding a family natively is a
module and a line here. Torch-free: the command line reads this table before loading torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from actors.runners.native.config import STATIC_ROPE, NativeConfig, rope_parameters, sliding_window_applies

# Architecture → (family module under actors/runners/native, variant). The Llama family's
# decoder: RMSNorm, rotary embeddings, GQA attention (optional qkv biases, optional per-head q/k
# RMSNorm), SwiGLU MLP, tied or untied lm_head.
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", "llama"),
    "MistralForCausalLM": ("llama", "mistral"),
    "Qwen2ForCausalLM": ("llama", "qwen2"),
    "Qwen3ForCausalLM": ("llama", "qwen3"),
}


def family(hf: Any) -> ModuleType:
    """The family module that runs `hf` natively (its architecture must be registered)."""
    name, _ = ARCHITECTURES[hf.architectures[0]]
    return importlib.import_module(f"actors.runners.native.{name}")


def check(hf: Any, max_len: int | None = None) -> str | None:
    """None when the native path runs this model exactly (up to `max_len` tokens of context:
    a sliding window at least that long never slides); else why it does not."""
    archs = getattr(hf, "architectures", None) or []
    if len(archs) != 1 or archs[0] not in ARCHITECTURES:
        return f"architecture {archs} is not one of {sorted(ARCHITECTURES)}"
    rope = rope_parameters(hf)
    if rope.get("rope_type", "default") not in STATIC_ROPE:
        return f"rope_type {rope.get('rope_type')!r} (native: {sorted(STATIC_ROPE)})"
    if sliding_window_applies(hf, max_len):
        return "sliding-window attention"
    refusal: str | None = family(hf).refusal(hf)
    return refusal


def native_config(hf: Any) -> NativeConfig:
    heads = hf.num_attention_heads
    _, variant = ARCHITECTURES[hf.architectures[0]]
    return NativeConfig(
        family=variant,
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        rms_norm_eps=hf.rms_norm_eps,
        max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        qk_norm=variant == "qwen3",
        hf=hf,
    )
