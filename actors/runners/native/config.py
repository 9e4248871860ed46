"""What the native model path reads from a checkpoint's config, and whether it can run it.

Owns: `NativeConfig` (the shapes and switches of a Llama-family decoder) and `check()`, the one
place that decides whether a model runs natively or through transformers, with the reason.

The config is parsed with transformers' `AutoConfig`: it normalises the spellings of many
checkpoint generations (`rope_scaling` vs `rope_parameters`, missing `head_dim`, ...), which a
hand parser would re-implement. No transformers module runs at step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Architectures whose decoder is: RMSNorm, rotary embeddings, GQA attention (optional qkv
# biases, optional per-head q/k RMSNorm), SwiGLU MLP, tied or untied lm_head.
SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# Rope variants whose frequencies do not depend on the sequence length ("dynamic" rescales
# with the running length, longrope picks a table by length): one precomputed table serves.
STATIC_ROPE = {"default", "linear", "llama3", "yarn"}


@dataclass(frozen=True, slots=True)
class NativeConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before rotary
    hf: Any  # the transformers config, for rope's frequency functions


def load_hf_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)


def check(hf: Any, max_len: int | None = None) -> str | None:
    """None when the native path runs this model exactly (up to `max_len` tokens of context:
    a sliding window at least that long never slides); else why it does not."""
    archs = getattr(hf, "architectures", None) or []
    if len(archs) != 1 or archs[0] not in SUPPORTED:
        return f"architecture {archs} is not one of {sorted(SUPPORTED)}"
    if getattr(hf, "hidden_act", "silu") != "silu":
        return f"hidden_act {hf.hidden_act!r} (native: silu)"
    rope = rope_parameters(hf)
    if rope.get("rope_type", "default") not in STATIC_ROPE:
        return f"rope_type {rope.get('rope_type')!r} (native: {sorted(STATIC_ROPE)})"
    if _sliding_window_applies(hf, max_len):
        return "sliding-window attention"
    if getattr(hf, "mlp_bias", False):
        return "mlp_bias"
    return None


def native_config(hf: Any) -> NativeConfig:
    heads = hf.num_attention_heads
    return NativeConfig(
        family=SUPPORTED[hf.architectures[0]],
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
        qk_norm=SUPPORTED[hf.architectures[0]] == "qwen3",
        hf=hf,
    )


def rope_parameters(hf: Any) -> dict:
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    if "full_attention" in params:  # per-layer-type parameters: these families use one kind
        params = params["full_attention"]
    return dict(params)


def _sliding_window_applies(hf: Any, max_len: int | None) -> bool:
    window = getattr(hf, "sliding_window", None)
    if window is None or getattr(hf, "use_sliding_window", True) is False:
        return False
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return False
    return window < (max_len or hf.max_position_embeddings)
