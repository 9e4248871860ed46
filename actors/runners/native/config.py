"""What the native model path reads from a checkpoint's config.

Owns: `NativeConfig` (the shapes and switches of a native decoder) and the readings every
family shares (rope parameters, whether a sliding window slides); families.py decides from
them, and from each family's own refusals, whether a model runs natively.

The config is parsed with transformers' `AutoConfig`: it normalises the spellings of many
checkpoint generations (`rope_scaling` vs `rope_parameters`, missing `head_dim`, ...), which a
hand parser would re-implement. No transformers module runs at step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def rope_parameters(hf: Any) -> dict:
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    if "full_attention" in params:  # per-layer-type parameters: these families use one kind
        params = params["full_attention"]
    return dict(params)


def sliding_window_applies(hf: Any, max_len: int | None) -> bool:
    window = getattr(hf, "sliding_window", None)
    if window is None or getattr(hf, "use_sliding_window", True) is False:
        return False
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return False
    return window < (max_len or hf.max_position_embeddings)
