"""The vision-language families served, each as transformers builds it: which class loads it,
where its text tower, embeddings and LM head are, and how its vision tower turns one image's
processor arrays into one row per placeholder token.

- LLaVA (`llava`): a CLIP or SigLIP vision tower and a projector before a Llama-family text
  tower (transformers' `LlavaForConditionalGeneration`).
- Qwen2-VL (`qwen2_vl`): its own vision transformer with merged patches, and M-RoPE positions
  (three rotary sections: time, height, width) in the text tower (`Qwen2VLForConditionalGeneration`).
- Qwen2.5-VL (`qwen2_5_vl`): Qwen2-VL's text tower, positions and image arrays; its vision
  tower attends within windows in most blocks and merges with an MLP, all inside transformers'
  `get_image_features`, so it encodes as Qwen2-VL does (`Qwen2_5_VLForConditionalGeneration`).
- Idefics3 / SmolVLM (`idefics3`): a SigLIP-style tower over an image's tiles and its global
  view, pixel-shuffled by the connector, before a Llama text tower (`Idefics3ForConditionalGeneration`).

The vision tower runs transformers' SDPA attention; the text tower our paged attention.
`family_of(model_dir)` reads config.json's model_type (no weights). Imports torch, transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from runtime.model_store import VISION_MODEL_TYPES, vision_model_type

FAMILIES = {
    "llava": "LlavaForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "idefics3": "Idefics3ForConditionalGeneration",
}
assert tuple(FAMILIES) == VISION_MODEL_TYPES  # the start-up check (runtime/model_store.py) names the same ones


def family_of(model_dir: Path) -> str | None:
    return vision_model_type(model_dir)


def load(family: str, model_dir: Path, dtype: torch.dtype, attn: str) -> Any:
    import transformers

    cls = getattr(transformers, FAMILIES[family])
    return cls.from_pretrained(model_dir, dtype=dtype, attn_implementation={"text_config": attn, "vision_config": "sdpa"})


_VISION_TOWER = {"llava": "vision_tower", "qwen2_vl": "visual", "qwen2_5_vl": "visual", "idefics3": "vision_model"}


def blocks(family: str, model: Any) -> torch.nn.ModuleList:
    """The vision tower's repeated blocks (where its encoder can stop and go on: slices.py): the
    tower's longest module list (CLIP's and SigLIP's encoder layers, Qwen2-VL's blocks)."""
    tower = getattr(model.model, _VISION_TOWER[family])
    return max((m for m in tower.modules() if isinstance(m, torch.nn.ModuleList)), key=len)


def parts(model: Any) -> tuple[Any, Any, Any]:
    """(text tower, input embeddings, LM head)."""
    inner = model.model
    text = inner.text_model if hasattr(inner, "text_model") else inner.language_model  # Idefics3 names it text_model
    return text, model.get_input_embeddings(), model.lm_head


def encode(family: str, model: Any, arrays: dict[str, Any], device: torch.device) -> torch.Tensor:
    """One image's encoder output: [placeholder tokens, text hidden size]."""
    if family == "llava":
        pixels = torch.from_numpy(arrays["pixel_values"]).to(device=device, dtype=model.dtype)
        cfg = model.config
        out = model.model.get_image_features(
            pixel_values=pixels, vision_feature_layer=cfg.vision_feature_layer, vision_feature_select_strategy=cfg.vision_feature_select_strategy, return_dict=True
        )
        return torch.cat(list(out.pooler_output), dim=0)
    if family == "idefics3":  # [1, tiles, 3, H, W] and its pixel mask: one row per placeholder, tile by tile
        pixels = torch.from_numpy(arrays["pixel_values"]).to(device=device, dtype=model.dtype)
        mask = torch.from_numpy(arrays["pixel_attention_mask"]).to(device=device, dtype=torch.bool)
        return torch.cat(list(model.model.get_image_features(pixels, mask, return_dict=True).pooler_output), dim=0)
    # Qwen2-VL and Qwen2.5-VL: flattened patches and the image's (t, h, w) patch grid
    pixels = torch.from_numpy(arrays["pixel_values"]).to(device=device, dtype=model.dtype)
    grid = torch.from_numpy(arrays["image_grid_thw"]).to(device=device)
    out = model.model.get_image_features(pixels, grid, return_dict=True)
    return torch.cat(list(out.pooler_output), dim=0)
