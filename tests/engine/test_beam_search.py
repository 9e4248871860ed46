"""Beam search equals transformers' generate(num_beams=k) on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from actors.build import build_engine
from api.http.openai.completions.beam import beam_search
from tests.support.servers import tiny_config


@pytest.mark.parametrize("width", [2, 4])
async def test_beam_search_matches_transformers(tiny_model_dir: Path, width: int) -> None:
    prompt = [5, 17, 42, 99, 7, 63, 12]
    max_tokens = 8
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    x = torch.tensor([prompt])
    out = model.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, num_beams=width,
        num_return_sequences=width, do_sample=False, early_stopping=False, length_penalty=1.0,
        output_scores=True, return_dict_in_generate=True,
    )
    expected = [seq[len(prompt):].tolist() for seq in out.sequences]
    runtime = build_engine(tiny_config(tiny_model_dir))
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        beams = await beam_search(runtime, prompt, width, max_tokens)
        stats = runtime.statistics()
        nursery.cancel_scope.cancel()
    assert beams[0].tokens == expected[0]
    assert [b.tokens for b in beams] == expected
    scores = [b.cumulative_logprob for b in beams]
    assert scores == sorted(scores, reverse=True)
    assert torch.allclose(torch.tensor(scores), out.sequences_scores.float() * max_tokens, atol=1e-3)
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0
