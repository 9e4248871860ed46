"""A LLaVA-style model (CLIP vision tower, Llama text tower) on the paged engine: greedy output
token-identical to transformers' `generate` with the model's own processor on the same images,
alone and beside concurrent text and image requests (float32), with chunked prefill cutting
through images; the encoder runs once per image (the encoder cache), and a repeated image hits
the prefix cache while the same text with another image does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.build import build_engine
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config
from tests.support.tiny_vlm import VISION_CASES as CASES
from tests.support.tiny_vlm import case, image, reference_generate, run_all

NUM_NEW = 12


@pytest.mark.parametrize("overrides", [pytest.param({}, id="roomy"), pytest.param({"max_num_batched_tokens": 8}, id="chunked-through-images")])
async def test_llava_greedy_matches_transformers_alone_and_concurrent(llava_dir: Path, overrides: dict) -> None:
    expected = [reference_generate(llava_dir, *case(text, seeds)[::2], NUM_NEW) for text, seeds in CASES]
    assert expected[0] != expected[4]  # the image decides the output, not the text alone
    alone, _ = await run_all(llava_dir, CASES[:1], 0.0, NUM_NEW, **overrides)
    assert alone[0] == expected[0]
    got, stats = await run_all(llava_dir, CASES, 0.003, NUM_NEW, **overrides)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"case {i} {CASES[i]} diverged"
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0
    # Image 1 (cases 0 and 2) is encoded once: the encoder cache serves the repeat, or the prefix
    # cache does when case 0's image blocks were cached before case 2 was scheduled (timing).
    assert stats["images_encoded"] <= 4, stats


async def test_a_repeated_image_hits_the_prefix_cache_and_another_image_does_not(llava_dir: Path) -> None:
    runtime = build_engine(tiny_config(llava_dir))
    sampling = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    seen: list[dict] = []
    usages = []
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        for text, seeds in [("What is in the picture?", [1]), ("What is in the picture?", [1]), ("What is in the picture?", [2])]:
            messages, images, _ = case(text, seeds)
            async with runtime.submit(Prompt(messages=messages, images=tuple(images)), sampling) as stream:
                async for delta in stream:
                    if delta.usage is not None:
                        usages.append(delta.usage)
            seen.append(runtime.statistics())
        nursery.cancel_scope.cancel()
    hits = [s["prefix_hits"] for s in seen]
    prompt_tokens = usages[0].prompt_tokens
    print(f"prompt {prompt_tokens} tokens (16 of them the image's); prefix hits after each request: {hits}; cached tokens: {[u.cached_tokens for u in usages]}")
    assert prompt_tokens > 16  # usage counts the image's tokens
    assert hits[0] == 0
    assert hits[1] - hits[0] == (prompt_tokens - 1) // 4  # every full block of the repeated prompt, image blocks included
    assert usages[1].cached_tokens == 4 * hits[1]
    # Another image: only the blocks wholly before the image's first token (the role header) are shared.
    first_image_token = 5  # <|im_start|> u s er \n, then the image's 16 tokens
    assert hits[2] - hits[1] == first_image_token // 4 and usages[2].cached_tokens == 4 * (first_image_token // 4)
    assert seen[-1]["images_encoded"] == 2 and seen[-1]["encoder_cache_hits"] == 0  # the repeat was served by the prefix cache


async def test_an_image_after_other_text_is_served_by_the_encoder_cache(llava_dir: Path) -> None:
    """The prefix cache cannot serve image 1 behind other text; the encoder cache does."""
    runtime = build_engine(tiny_config(llava_dir, max_num_batched_tokens=128))  # each prompt in one step
    sampling = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    seen = []
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        for lead in ("", "Look at this first. "):
            messages, images, _ = case("What is in the picture?", [1])
            messages[0]["content"].insert(0, {"type": "text", "text": lead})
            async with runtime.submit(Prompt(messages=messages, images=tuple(images)), sampling) as stream:
                async for _ in stream:
                    pass
            seen.append(runtime.statistics())
        nursery.cancel_scope.cancel()
    assert [(s["images_encoded"], s["encoder_cache_hits"]) for s in seen] == [(1, 0), (1, 1)]


def test_admission_charges_each_image_its_tokens() -> None:
    from runtime.admission import estimate_tokens

    prompt = Prompt(messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "abcdefgh"}]}], images=(image(1)[0], image(2)[0]))
    sampling = SamplingParams(max_tokens=10)
    assert estimate_tokens(prompt, sampling, 512, tokens_per_image=16) - estimate_tokens(prompt, sampling, 512) == 32
