"""Greedy output of the engine against transformers' `generate()`, and the tiny decoder shapes.

`run_engine` submits prompts concurrently and staggered, so they join a running batch
mid-flight, get chunked and (two share a prefix) hit the prefix cache; `reference` is what
transformers generates for the same prompts. `SHAPES` are the Llama-family variants the
native model path is checked on (`tiny_model.build_tiny_decoder` builds each).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import trio
from transformers import AutoModelForCausalLM

from actors.build import build_engine
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config

NUM_NEW = 20

SHAPES = {
    "llama-tied-llama3-rope": ("llama", dict(tie_word_embeddings=True, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama-linear-rope-biases": ("llama", dict(attention_bias=True, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "llama-yarn-rope": ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128})),
    "mistral": ("mistral", dict(sliding_window=None, head_dim=24)),
    "qwen2-gqa-biases": ("qwen2", dict(num_attention_heads=8, num_key_value_heads=2)),
    "qwen3-qk-norm-tied": ("qwen3", {}),
}


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
    return await greedy_concurrently(model_dir, [Prompt(token_ids=p) for p in prompts], NUM_NEW, 0.004, **overrides)


async def greedy_concurrently(
    model_dir: Path, prompts: list[Prompt], num_new: int, stagger: float, adapters: list[str | None] | None = None, **overrides: object
) -> tuple[list[list[int]], dict]:  # fmt: skip
    """Greedy tokens of each prompt on the tiny engine, submitted concurrently and staggered (later
    ones join a running batch), each for its LoRA adapter in `adapters` if given, and the
    engine's statistics after."""
    runtime = build_engine(tiny_config(model_dir, **overrides))
    results: list[list[int]] = [[] for _ in prompts]

    async def one(i: int) -> None:
        await trio.sleep(stagger * i)
        adapter = adapters[i] if adapters else None
        async with runtime.submit(prompts[i], SamplingParams(temperature=0.0, max_tokens=num_new, ignore_eos=True, adapter=adapter)) as stream:
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
