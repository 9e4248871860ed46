"""What a checkpoint needs that no model path here serves: `checkpoint_error`, read from its
config.json alone before anything loads, so a model that would be served silently wrong is
refused at start in one line instead (the command line exits 2 with it).

Refused: quantized weights (`quantization_config`: GPTQ, AWQ, bitsandbytes, compressed-tensors
...: both paths would read the stored integers or floats as plain weights; FP8 in transformers'
format is dequantized by the native path's loader and refused on the other, model_paths.py), attention sinks (gpt-oss),
logit softcapping (Gemma 2), a rotary that changes with the length (longrope, dynamic NTK)
past the length it changes at, and sliding-window attention past the window (Mistral v0.1,
Gemma 2/3, Phi-3): the paged attention attends to every earlier position, which is the model
only while the context fits in the window, so a window is served when `--max-model-len` is
within it. A name that looks like a Hugging Face Hub id is answered with how to pass a local
directory (nothing is downloaded). Imports nothing but the standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

FP8_METHOD = "fp8"  # transformers' fine-grained FP8: float8 weights with `weight_scale_inv` (Qwen3-FP8, DeepSeek)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_id_error(model: str, flag: str = "--model") -> str | None:
    """A missing path shaped like `org/name`: say that nothing is downloaded, and how to get it."""
    if not _HUB_ID.match(model) or Path(model).expanduser().exists():
        return None
    return (
        f"{flag} {model!r}: looks like a Hugging Face Hub id, and models are not downloaded here; "
        f"fetch it first (huggingface-cli download {model} --local-dir DIR) and give {flag} DIR"
    )


def checkpoint_error(model: str | None, max_model_len: int | None = None, flag: str = "--model", native: Collection[str] = ()) -> str | None:
    """Why this model directory would be served wrong, from its config.json; None when it is
    fine (or has no config.json to read: other checks say so). `native`: the architectures the
    native path runs (actors/runners/native/families.py), the ones whose FP8 weights it serves."""
    if model is None:
        return None
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    why = _quantized(config, native) or _sinks(config) or _softcap(text) or _window(text, max_model_len) or _length_rope(text, max_model_len)
    return f"{flag} {model!r}: {why}" if why else None


def fp8(model: str | Path) -> bool:
    """Whether this model directory's weights are FP8 in transformers' format."""
    try:
        quant = json.loads((Path(model).expanduser() / "config.json").read_text()).get("quantization_config")
    except (OSError, ValueError):
        return False
    return isinstance(quant, dict) and quant.get("quant_method") == FP8_METHOD


def _quantized(config: dict[str, Any], native: Collection[str]) -> str | None:
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
    if method == FP8_METHOD:  # dequantized by the native path's loader; transformers' modules on a GPU would run their own FP8 kernels
        archs = config.get("architectures") or []
        if len(archs) == 1 and archs[0] in native:
            return None
        return f"its weights are FP8 (quantization_config.quant_method 'fp8'), served on the native path only ({', '.join(sorted(native))}), not {archs}"
    return (
        f"its weights are quantized (quantization_config.quant_method {method!r}), which is not served: "
        "give the checkpoint in bf16, fp16 or fp32 (the CPU's default serves int4 blocks of those, --quantization)"
    )


def _sinks(config: dict[str, Any]) -> str | None:
    if config.get("model_type") == "gpt_oss":
        return "attention sinks (model_type 'gpt_oss') are not served: its attention would drop them"
    return None


def _softcap(config: dict[str, Any]) -> str | None:
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) not in (None, 0, 0.0):
            return f"logit softcapping ({key} {config[key]}) is not served: its attention and logits would skip it"
    return None


def _length_rope(config: dict[str, Any], max_model_len: int | None) -> str | None:
    """A rotary that changes with the sequence's length (longrope past its original context,
    dynamic NTK past the model's): transformers picks it from a step's longest position, so in
    a step of several sequences every row would get the longest one's."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    params = params.get("full_attention", params) if isinstance(params, dict) else {}
    kind = params.get("rope_type") or params.get("type")
    if kind not in ("longrope", "dynamic"):
        return None
    positions = config.get("max_position_embeddings") or 0
    original = params.get("original_max_position_embeddings") or config.get("original_max_position_embeddings") or positions
    if kind == "dynamic":
        original = positions
    if (max_model_len if max_model_len is not None else positions) <= original:
        return None
    return (
        f"rope_type {kind!r} changes its rotary with the sequence's length past {original} positions, which a step of several "
        f"sequences cannot hold (every row would get the longest one's): give --max-model-len {original} or less"
    )


def _window(config: dict[str, Any], max_model_len: int | None) -> str | None:
    window = config.get("sliding_window")
    if not isinstance(window, int) or config.get("use_sliding_window") is False:
        return None
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and "sliding_attention" not in layer_types:
        return None
    positions = config.get("max_position_embeddings") or 0
    limit = max_model_len if max_model_len is not None else positions
    if window >= limit:
        return None
    return (
        f"sliding-window attention (a {window}-token window, {positions} positions) is served only within the window: "
        f"give --max-model-len {window} or less"
    )
