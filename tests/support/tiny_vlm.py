"""Tiny random-weight vision-language models, built in-process (no hub): a LLaVA (CLIP vision
tower, projector, Llama text tower), a Qwen2-VL, a Qwen2.5-VL and an Idefics3 (SmolVLM), each with its
processor on Pillow alone, and greedy references from transformers' own `generate` with that
processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.images import ImageInput, content_hash
from runtime.request import Prompt
from tests.support.images import pil_image, png_bytes
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


def build_tiny_qwen2_vl(path: Path, seed: int = 0) -> Path:
    """A tiny Qwen2-VL: its vision transformer (patches of 14, merged 2x2) and a Qwen2 text tower
    with M-RoPE (sections 2, 3, 3 of a 16-wide head); images between 56x56 and 112x112 pixels."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    return _build_qwen_vl(path, seed, Qwen2VLConfig, Qwen2VLForConditionalGeneration, vision)


def build_tiny_qwen2_5_vl(path: Path, seed: int = 0) -> Path:
    """A tiny Qwen2.5-VL: what `build_tiny_qwen2_vl` builds, with Qwen2.5-VL's vision tower:
    window attention in its first block (windows of 56 pixels: 2x2 merged tokens, so the test
    images span several windows, partial ones included), full attention in its second, and its
    MLP merger."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        window_size=56, fullatt_block_indexes=[1], out_hidden_size=64,
    )  # fmt: skip
    return _build_qwen_vl(path, seed, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, vision)


def _build_qwen_vl(path: Path, seed: int, config_cls: Any, model_cls: Any, vision: dict[str, Any]) -> Path:
    """A Qwen2-VL-style model: the tokenizer with its vision tokens, the Pillow image processor
    (images between 56x56 and 112x112 pixels), a Qwen2 text tower with M-RoPE (sections 2, 3, 3
    of a 16-wide head) and `vision` for its vision tower."""
    import torch
    from transformers import GenerationConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(path)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]})
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    tokenizer.save_pretrained(path)
    Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112).save_pretrained(path)
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"), ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config = config_cls(text_config=text, vision_config=vision, **ids)
    torch.manual_seed(seed)
    model = model_cls(config)
    _widen(model)
    with torch.no_grad():  # sharp attention, so that positions decide the output: at the random init's
        for layer in model.model.language_model.layers:  # near-uniform attention, plain positions in
            layer.self_attn.q_proj.weight.mul_(4.0)  # place of M-RoPE moved the logits by < 0.01
            layer.self_attn.k_proj.weight.mul_(4.0)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    return path


def build_tiny_idefics3(path: Path, seed: int = 0) -> Path:
    """A tiny Idefics3 (SmolVLM): a vision tower over 32x32 tiles (patches of 8, pixel-shuffled
    by 2: 4 tokens a tile), images resized to at most 64 pixels and split into up to 2x2 tiles
    plus the global view, and a Llama text tower."""
    import torch
    from transformers import GenerationConfig, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(path)
    grid = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    tokenizer.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>", *grid]})
    tokenizer.chat_template = LLAVA_TEMPLATE
    images = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=LLAVA_TEMPLATE).save_pretrained(path)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    _widen(model)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    return path


def image(seed: int, size: tuple[int, int] = (40, 30)) -> tuple[ImageInput, Any]:
    pil = pil_image(png_bytes(*size, seed=seed))
    pixels = pil.tobytes()
    return ImageInput(width=pil.width, height=pil.height, pixels=pixels, hash=content_hash(pil.width, pil.height, pixels)), pil


def case(text: str, seeds: list[int]) -> tuple[list[dict[str, Any]], list[ImageInput], list[Any]]:
    made = [image(s, (40 + 3 * s, 30 + s)) for s in seeds]
    content = [{"type": "image"} for _ in seeds] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}], [m[0] for m in made], [m[1] for m in made]


VISION_CASES = [
    ("What is in the picture?", [1]),
    ("Compare these.", [2, 3]),
    ("Describe the dog and the fox.", [1]),  # image 1 again: the encoder cache
    ("def add(a, b): return a + b", []),  # text beside the images
    ("What is in the picture?", [4]),  # the same text as case 0, another image
]


async def run_all(model_dir: Path, cases: list[tuple[str, list[int]]], stagger: float, num_new: int, **overrides: object) -> tuple[list[list[int]], dict]:
    """Greedy tokens of each case on the engine, submitted concurrently (staggered), and its statistics after."""
    from tests.support.equivalence import greedy_concurrently

    prompts = []
    for text, picks in cases:
        messages, images, _ = case(text, picks)
        prompts.append(Prompt(messages=messages, images=tuple(images)))
    return await greedy_concurrently(model_dir, prompts, num_new, stagger, **overrides)
