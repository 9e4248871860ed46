"""Greedy output of the engine is token-identical to transformers' generate().

Eight prompts of different lengths are submitted concurrently and staggered, so they join a
running batch mid-flight, get chunked (a tiny per-step token budget), hit the prefix cache
(two share a prefix) and, in the second test, are preempted and resumed (a tiny KV cache).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from actors.build import build_engine
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.conftest import tiny_config

NUM_NEW = 20


def make_prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(1234)
    lengths = (1, 3, 7, 12, 18, 25, 40, 61)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
    prompts.append(prompts[6][:33] + [5, 6, 7])  # shares a 33-token prefix with prompt 6
    return prompts


def reference(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, do_sample=False)
        out.append(gen[0, len(p) :].tolist())
    return out


async def run_engine(model_dir: Path, prompts: list[list[int]], **overrides: object) -> tuple[list[list[int]], dict]:
    runtime = build_engine(tiny_config(model_dir, **overrides))
    results: list[list[int]] = [[] for _ in prompts]

    async def one(i: int) -> None:
        await trio.sleep(0.004 * i)  # staggered: later ones join a running batch
        sampling = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
        async with runtime.submit(Prompt(token_ids=prompts[i]), sampling) as stream:
            async for delta in stream:
                results[i] += delta.token_ids

    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        async with trio.open_nursery() as clients:
            for i in range(len(prompts)):
                clients.start_soon(one, i)
        stats = runtime.statistics()
        nursery.cancel_scope.cancel()
    return results, stats


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="roomy-cache"),
        pytest.param({"num_kv_blocks": 40, "max_num_batched_tokens": 16}, id="preempting-cache"),
    ],
)
async def test_greedy_matches_transformers_generate(tiny_model_dir: Path, overrides: dict) -> None:
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    prompts = make_prompts(vocab)
    expected = reference(tiny_model_dir, prompts)
    got, stats = await run_engine(tiny_model_dir, prompts, **overrides)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"prompt {i} (len {len(prompts[i])}) diverged"
    assert stats["requests"] == 0 and stats["kv_blocks_used"] == 0 and stats["live_requests"] == 0
    assert stats["prefix_hits"] > 0
    if overrides:
        assert stats["preemptions"] > 0
