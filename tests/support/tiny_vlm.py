"""Tiny random-weight vision-language models, built in-process (no hub): a LLaVA (CLIP vision
tower, projector, Llama text tower) and a Qwen2-VL, each with its processor on Pillow alone,
and greedy references from transformers' own `generate` with that processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.tiny_model import build_tokenizer

# Image parts render as the processor's image marker; text as itself.
LLAVA_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN2_VL_TEMPLATE = LLAVA_TEMPLATE.replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")


def _widen(model: Any) -> None:
    import torch

    with torch.no_grad():  # well-separated logits: greedy comparisons test the engine, not float noise
        model.lm_head.weight.mul_(8.0)


def build_tiny_llava(path: Path, seed: int = 0) -> Path:
    import torch
    from transformers import CLIPVisionConfig, GenerationConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(path)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = LLAVA_TEMPLATE
    images = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default", chat_template=LLAVA_TEMPLATE, num_additional_image_tokens=1
    )
    processor.save_pretrained(path)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-1, vision_feature_select_strategy="default"
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    _widen(model)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    return path


def reference_generate(model_dir: Path, messages: list[dict[str, Any]], images: list[Any], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate` with the model's own processor (float32)."""
    import torch
    import transformers

    from actors.multimodal import load_processor
    from actors.runners.vision.families import FAMILIES, family_of

    family = family_of(model_dir)
    assert family is not None
    processor = load_processor(model_dir, family)
    model = getattr(transformers, FAMILIES[family]).from_pretrained(model_dir, dtype=torch.float32).eval()
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=images or None, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, inputs["input_ids"].shape[1] :]]
