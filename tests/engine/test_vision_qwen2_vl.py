"""Qwen2-VL and Qwen2.5-VL on the paged engine: their own vision transformers (Qwen2.5-VL's with
window attention and an MLP merger), and M-RoPE positions (time, height, width) computed with
the prompt and carried to the runner, later positions offset by the prompt's delta. Greedy
output token-identical to transformers' `generate` with the model's processor (its Pillow image
processor; no torchvision), alone and beside concurrent text and image requests, with chunked
prefill cutting through images (float32); `detail: low` caps an image's resolution.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from actors.multimodal import LOW_DETAIL_PIXELS, ImagePrompts, load_processor
from runtime.request import Prompt
from tests.support.tiny_vlm import VISION_CASES as CASES
from tests.support.tiny_vlm import case, image, reference_generate, run_all

NUM_NEW = 12
FAMILIES = [pytest.param("qwen2_vl_dir", id="qwen2-vl"), pytest.param("qwen2_5_vl_dir", id="qwen2.5-vl")]


@pytest.mark.parametrize("overrides", [pytest.param({}, id="roomy"), pytest.param({"max_num_batched_tokens": 8}, id="chunked-through-images")])
@pytest.mark.parametrize("fixture", FAMILIES)
async def test_greedy_matches_transformers_alone_and_concurrent(fixture: str, overrides: dict, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    expected = [reference_generate(model_dir, *case(text, seeds)[::2], NUM_NEW) for text, seeds in CASES]
    assert expected[0] != expected[4]  # the image decides the output
    alone, _ = await run_all(model_dir, CASES[:1], 0.0, NUM_NEW, **overrides)
    assert alone[0] == expected[0]
    got, stats = await run_all(model_dir, CASES, 0.003, NUM_NEW, **overrides)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"case {i} {CASES[i]} diverged"
    # Image 1 (cases 0 and 2) is encoded once: the encoder cache serves the repeat, or the prefix
    # cache does when case 0's image blocks were cached before case 2 was scheduled (timing).
    assert stats["kv_blocks_used"] == 0 and stats["images_encoded"] <= 4, stats


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_mrope_positions_are_transformers_get_rope_index(family: str, request: pytest.FixtureRequest) -> None:
    """The prompt's M-RoPE positions and delta (actors/multimodal.py) are what the model's own
    `get_rope_index` makes of the processor's output, images between text and back to back."""
    import torch
    import transformers

    from actors.runners.vision.families import FAMILIES

    model_dir: Path = request.getfixturevalue(f"{family}_dir")
    processor = load_processor(model_dir, family)
    prompts = ImagePrompts(processor, family)
    model = getattr(transformers, FAMILIES[family]).from_pretrained(model_dir, dtype=torch.float32)
    messages, images, pil = case("Compare these.", [2, 3])
    messages[0]["content"].insert(1, {"type": "text", "text": "and"})
    ids, mm = prompts.encode(Prompt(messages=messages, images=tuple(images)))
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=pil, return_tensors="pt", add_special_tokens=False)
    assert inputs["input_ids"][0].tolist() == ids
    expected, delta = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"])
    assert mm.mrope_positions is not None and mm.mrope_positions.tolist() == expected[:, 0].tolist()
    assert mm.mrope_delta == int(delta[0, 0]) != 0


def test_qwen2_5_vl_images_span_several_attention_windows(qwen2_5_vl_dir: Path) -> None:
    """The equivalence above tests the window attention only if an image is wider or taller
    than one window (2x2 merged tokens in the tiny model), so that windows split it."""
    prompts = ImagePrompts(load_processor(qwen2_5_vl_dir, "qwen2_5_vl"), "qwen2_5_vl")
    grids = []
    for text, seeds in CASES:
        if not seeds:
            continue
        messages, images, _ = case(text, seeds)
        grids += [mm.arrays["image_grid_thw"][0] for mm in prompts.encode(Prompt(messages=messages, images=tuple(images)))[1].images]
    assert max(max(int(h), int(w)) // 2 for _, h, w in grids) > 2, grids


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_low_detail_caps_the_resolution(family: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(f"{family}_dir")
    prompts = ImagePrompts(load_processor(model_dir, family), family)
    big, _ = image(9, (600, 400))
    messages = case("What?", [])[0]
    messages[0]["content"].insert(0, {"type": "image"})
    _, high = prompts.encode(Prompt(messages=messages, images=(big,)))
    _, low = prompts.encode(Prompt(messages=messages, images=(msgspec.structs.replace(big, detail="low"),)))
    assert high.images[0].hash != low.images[0].hash
    pixels = [int(mm.images[0].arrays["image_grid_thw"][0][1:].prod()) * 14 * 14 for mm in (high, low)]
    assert pixels[0] <= 112 * 112 and pixels[1] <= min(LOW_DETAIL_PIXELS, 112 * 112 // 4) < pixels[0]
    assert low.images[0].num_tokens < high.images[0].num_tokens
