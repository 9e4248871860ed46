"""Qwen2-VL on the paged engine: its own vision transformer, and M-RoPE positions (time,
height, width) computed with the prompt and carried to the runner, later positions offset by
the prompt's delta. Greedy output token-identical to transformers' `generate` with the model's
processor (its Pillow image processor; no torchvision), alone and beside concurrent text and
image requests, with chunked prefill cutting through images (float32); `detail: low` caps an
image's resolution.
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


@pytest.mark.parametrize("overrides", [pytest.param({}, id="roomy"), pytest.param({"max_num_batched_tokens": 8}, id="chunked-through-images")])
async def test_qwen2_vl_greedy_matches_transformers_alone_and_concurrent(qwen2_vl_dir: Path, overrides: dict) -> None:
    expected = [reference_generate(qwen2_vl_dir, *case(text, seeds)[::2], NUM_NEW) for text, seeds in CASES]
    assert expected[0] != expected[4]  # the image decides the output
    alone, _ = await run_all(qwen2_vl_dir, CASES[:1], 0.0, NUM_NEW, **overrides)
    assert alone[0] == expected[0]
    got, stats = await run_all(qwen2_vl_dir, CASES, 0.003, NUM_NEW, **overrides)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"case {i} {CASES[i]} diverged"
    # Image 1 (cases 0 and 2) is encoded once: the encoder cache serves the repeat, or the prefix
    # cache does when case 0's image blocks were cached before case 2 was scheduled (timing).
    assert stats["kv_blocks_used"] == 0 and stats["images_encoded"] <= 4, stats


def test_low_detail_caps_the_resolution(qwen2_vl_dir: Path) -> None:
    prompts = ImagePrompts(load_processor(qwen2_vl_dir, "qwen2_vl"), "qwen2_vl")
    big, _ = image(9, (600, 400))
    messages = case("What?", [])[0]
    messages[0]["content"].insert(0, {"type": "image"})
    _, high = prompts.encode(Prompt(messages=messages, images=(big,)))
    _, low = prompts.encode(Prompt(messages=messages, images=(msgspec.structs.replace(big, detail="low"),)))
    assert high.images[0].hash != low.images[0].hash
    pixels = [int(mm.images[0].arrays["image_grid_thw"][0][1:].prod()) * 14 * 14 for mm in (high, low)]
    assert pixels[0] <= 112 * 112 and pixels[1] <= min(LOW_DETAIL_PIXELS, 112 * 112 // 4) < pixels[0]
    assert low.images[0].num_tokens < high.images[0].num_tokens
