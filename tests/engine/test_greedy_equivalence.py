"""Greedy output of the engine is token-identical to transformers' generate().

Eight prompts of different lengths are submitted concurrently and staggered, so they join a
running batch mid-flight, get chunked (a tiny per-step token budget), hit the prefix cache
(two share a prefix) and, in the second test, are preempted and resumed (a tiny KV cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from tests.support.equivalence import make_prompts, reference, run_engine


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"async_scheduling": False}, id="roomy-cache"),
        pytest.param({"num_kv_blocks": 40, "max_num_batched_tokens": 16, "async_scheduling": False}, id="preempting-cache"),
        pytest.param({"async_scheduling": True}, id="async-scheduling"),
        pytest.param({"num_kv_blocks": 40, "max_num_batched_tokens": 16, "async_scheduling": True}, id="async-preempting"),
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
    assert (stats["steps_ahead"] > 0) == bool(overrides.get("async_scheduling"))
    if "num_kv_blocks" in overrides:
        assert stats["preemptions"] > 0
