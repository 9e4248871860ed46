"""A LLaVA built in-process for the vision bench, and the images it is sent.

`build_llava(path, tokenizer_dir)`: a CLIP vision tower (224x224 pixels, patches of 14: 256
image tokens an image), a projector and a Llama text tower, random weights, float32, with the
tokenizer of `tokenizer_dir` (the embedded SmolLM2's: a real vocabulary) plus `<image>`, and a
LLaVA processor on Pillow alone (no torchvision); with `text_weights`, the text tower is
`tokenizer_dir`'s own model with its weights (SmolLM2-135M: SmolVLM-256M's text tower), so text
requests get that model's text and its step times. The bench measures the scheduling of image
requests beside text streams, not what the model says of a picture. `noise_png(seed)`: a
distinct picture per seed, so every image request makes the encoder run. Imports torch,
transformers, numpy and Pillow when called.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_llava(path: Path, tokenizer_dir: str | Path, sizes: dict[str, int] | None = None, seed: int = 0, text_weights: bool = False) -> Path:
    """`sizes`: text_hidden, text_layers, vision_hidden, vision_layers, image_size, patch.
    `text_weights`: the text tower is `tokenizer_dir`'s own Llama-family model, its config and
    float weights (the embedded SmolLM2-135M: the text tower of SmolVLM-256M), the new
    `<image>` token's embedding row random; `sizes`' text entries are then unused."""
    import torch
    from transformers import AutoTokenizer, CLIPVisionConfig, GenerationConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    s = {"text_hidden": 512, "text_layers": 6, "vision_hidden": 384, "vision_layers": 6, "image_size": 224, "patch": 14, **(sizes or {})}
    path.mkdir(parents=True, exist_ok=True)
    tokenizer: Any = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = TEMPLATE
    size = s["image_size"]
    images = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    processor = LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=s["patch"], vision_feature_select_strategy="default", chat_template=TEMPLATE, num_additional_image_tokens=1
    )
    processor.save_pretrained(path)
    vision = CLIPVisionConfig(
        hidden_size=s["vision_hidden"], intermediate_size=4 * s["vision_hidden"], num_hidden_layers=s["vision_layers"], num_attention_heads=6,
        image_size=size, patch_size=s["patch"], projection_dim=s["vision_hidden"],
    )  # fmt: skip
    if text_weights:
        text = LlamaConfig.from_pretrained(tokenizer_dir)
        text.vocab_size = len(tokenizer)
    else:
        text = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=s["text_hidden"], intermediate_size=2 * s["text_hidden"], num_hidden_layers=s["text_layers"],
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-1, vision_feature_select_strategy="default"
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    if text_weights:
        _load_text_tower(model, Path(tokenizer_dir))
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    return path


def _load_text_tower(model: Any, model_dir: Path) -> None:
    """A Llama checkpoint's weights (`model.*`, the LM head tied or `lm_head.weight`) into the
    LLaVA's language model; rows past the checkpoint's vocabulary keep their random init."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(model_dir / "model.safetensors")
    tower = model.model.language_model
    with torch.no_grad():
        for name, param in tower.named_parameters():
            source = weights["model." + name]
            if name == "embed_tokens.weight":  # the checkpoint's rows; `<image>`'s stays random
                param[: source.shape[0]].copy_(source)
            else:
                param.copy_(source)
        head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        model.lm_head.weight[: head.shape[0]].copy_(head)


def noise_png(seed: int, width: int = 320, height: int = 240) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()
