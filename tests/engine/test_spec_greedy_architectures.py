"""Greedy output with n-gram drafts equals that without, on other architectures and model paths.

tests/engine/test_spec_decoding.py checks drafts on the tiny Llama, which the native path runs.
Here Qwen3 (GQA, per-head q/k norms, head_dim apart from hidden / heads) on the native path and
Qwen2 (q/k/v biases) on transformers' modules, float32: concurrent, staggered prompts with a KV
cache too small for all of them (requests are preempted, their drafts' blocks with them, and
recomputed) and shared prefixes (prefix-cache hits, also for preempted requests coming back).
Some requests carry a frequency penalty (each verify row counts the draft tokens before it).
Every request's tokens must equal those with drafts off, and the statistics must show
preemption, prefix hits, and drafts both kept and rejected.

The Qwen3 here has untied embeddings: with the tiny model's scaled, tied embedding every greedy
output falls into repeating one token at once, where a verify row reading the wrong position's
logits still gives the right token (checked: such a planted bug passed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from transformers import AutoConfig

from runtime.messages import TextDelta
from runtime.sampling import SamplingParams
from tests.support.equivalence import SHAPES, make_prompts
from tests.support.servers import tiny_config
from tests.support.spec import always_draft, generate, running, tokens
from tests.support.tiny_model import build_tiny_decoder

NUM_NEW = 32
SMALL = dict(num_kv_blocks=40, max_num_batched_tokens=16)  # 4-token blocks: preemption under this load


async def run(model_dir: Path, impl: str, spec: str, prompts: list[list[int]]) -> tuple[list[list[int]], dict]:
    results: list[list[TextDelta]] = [[] for _ in prompts]
    async with running(tiny_config(model_dir, model_impl=impl, spec_decoding=spec, **SMALL)) as engine:

        async def one(i: int) -> None:
            penalty = 0.1 if i % 3 == 2 else 0.0
            sampling = SamplingParams(temperature=0.0, frequency_penalty=penalty, max_tokens=NUM_NEW, ignore_eos=True)
            results[i] = await generate(engine, prompts[i], sampling, stagger=0.004 * i)

        async with trio.open_nursery() as clients:
            for i in range(len(prompts)):
                clients.start_soon(one, i)
        return [tokens(r) for r in results], engine.statistics()


@pytest.mark.parametrize(
    ("family", "overrides", "impl"),
    [
        pytest.param("qwen3", dict(tie_word_embeddings=False), "native", id="qwen3-native"),
        pytest.param(*SHAPES["qwen2-gqa-biases"], "transformers", id="qwen2-transformers"),
    ],
)
async def test_greedy_drafts_change_no_token_under_preemption_and_prefix_hits(
    family: str, overrides: dict, impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    always_draft(monkeypatch)
    model_dir = build_tiny_decoder(tmp_path, family, **overrides)
    prompts = make_prompts(AutoConfig.from_pretrained(model_dir).vocab_size)  # two share a 33-token prefix
    prompts += [[5, 6, 7] * 4, [40, 41, 42, 43] * 3 + [9], prompts[6][:33] + [5, 6, 7] * 2, [11] * 6]
    plain, plain_stats = await run(model_dir, impl, "off", prompts)
    drafted, stats = await run(model_dir, impl, "ngram", prompts)
    for i, (got, want) in enumerate(zip(drafted, plain)):
        assert len(got) == NUM_NEW and got == want, f"prompt {i} (len {len(prompts[i])}) diverged"
    assert stats["preemptions"] > 0 and stats["prefix_hits"] > 0, stats
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"], stats  # drafts kept, and drafts rejected
    assert plain_stats["spec_draft_tokens"] == 0 and stats["kv_blocks_used"] == 0 and stats["requests"] == 0
