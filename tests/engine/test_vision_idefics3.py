"""Idefics3 (SmolVLM) on the paged engine: an image split into tiles plus its global view, each
tile's placeholders a run of their own between the processor's tile markers, the tiles encoded
together and scattered run by run. Greedy output token-identical to transformers' `generate`
with the model's processor (its Pillow image processor), alone and beside concurrent text and
image requests, with chunked prefill cutting through images (float32); `detail: low` turns the
splitting off.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from actors.multimodal import ImagePrompts, load_processor
from runtime.request import Prompt
from tests.support.tiny_vlm import VISION_CASES as CASES
from tests.support.tiny_vlm import case, image, reference_generate, run_all

NUM_NEW = 12


@pytest.mark.parametrize("overrides", [pytest.param({}, id="roomy"), pytest.param({"max_num_batched_tokens": 8}, id="chunked-through-images")])
async def test_idefics3_greedy_matches_transformers_alone_and_concurrent(idefics3_dir: Path, overrides: dict) -> None:
    expected = [reference_generate(idefics3_dir, *case(text, seeds)[::2], NUM_NEW) for text, seeds in CASES]
    assert expected[0] != expected[4]  # the image decides the output
    alone, _ = await run_all(idefics3_dir, CASES[:1], 0.0, NUM_NEW, **overrides)
    assert alone[0] == expected[0]
    got, stats = await run_all(idefics3_dir, CASES, 0.003, NUM_NEW, **overrides)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"case {i} {CASES[i]} diverged"
    assert stats["kv_blocks_used"] == 0 and stats["images_encoded"] <= 4, stats


def test_tiles_and_low_detail(idefics3_dir: Path) -> None:
    prompts = ImagePrompts(load_processor(idefics3_dir, "idefics3"), "idefics3")
    wide, _ = image(9, (60, 30))
    messages = case("What?", [])[0]
    messages[0]["content"][:0] = [{"type": "image"}, {"type": "image"}]
    _, high = prompts.encode(Prompt(messages=messages, images=(wide, image(3)[0])))
    assert [len(i.runs) for i in high.images] == [3, 5]  # 1x2 and 2x2 tiles, and the global view
    assert all(length == 4 for i in high.images for _, length in i.runs)
    low_images = tuple(msgspec.structs.replace(i, detail="low") for i in (wide, image(3)[0]))
    _, low = prompts.encode(Prompt(messages=messages, images=low_images))
    assert [len(i.runs) for i in low.images] == [1, 1] and low.images[0].hash != high.images[0].hash
    assert prompts.max_tokens_per_image >= 5 * 4  # admission's charge: a large image's 2x2 tiles and global view
