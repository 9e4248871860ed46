"""With n-gram drafts on, a seeded request gives the same tokens alone and beside 31 others, and
the same as with drafts off.

32 requests of different prompts (most repeat themselves, so drafts are proposed and kept),
seeds, lengths and sampling settings (temperature, top-p, top-k, penalties, a stop token, a
few greedy). Each runs alone on an engine with drafts on, then all 32 together, staggered (the
steps mix prompt chunks, decodes, verify rows of drafts and finishing requests), then all 32
on an engine with drafts off. Every verify row samples with its request's own seed and
position, so neither the crowd nor the drafts may change a token. Float32 (the tiny model's
steps give a row the same logits whatever rows share its step).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from runtime.messages import TextDelta
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config
from tests.support.spec import always_draft, generate, running, tokens


def requests() -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(32)
    out = []
    for i in range(32):
        period = [rng.randrange(3, 300) for _ in range(rng.randrange(1, 5))]
        prompt = period * rng.randrange(2, 5) if i % 4 else [rng.randrange(3, 300) for _ in range(rng.randrange(3, 20))]
        options: dict[str, object] = dict(
            temperature=[0.8, 1.0, 0.0, 0.5][i % 4],
            top_p=0.9 if i % 3 == 0 else 1.0,
            top_k=[0, 5, 0, 40][i % 4],
            seed=1000 + i,
            max_tokens=16 + (i % 5) * 6,
            ignore_eos=True,
        )
        if i % 7 == 0:
            options.update(frequency_penalty=0.5, repetition_penalty=1.1)
        if i % 9 == 4:
            options.update(stop_token_ids=[period[0]])
        out.append((prompt, SamplingParams(**options)))  # type: ignore[arg-type]
    return out


async def crowd(engine: object, reqs: list[tuple[list[int], SamplingParams]]) -> list[list[TextDelta]]:
    results: list[list[TextDelta]] = [[] for _ in reqs]

    async def one(i: int) -> None:
        results[i] = await generate(engine, *reqs[i], stagger=0.002 * i)

    async with trio.open_nursery() as nursery:
        for i in range(len(reqs)):
            nursery.start_soon(one, i)
    return results


async def test_seeded_requests_match_alone_in_a_crowd_and_without_drafts(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    always_draft(monkeypatch)
    reqs = requests()
    async with running(tiny_config(tiny_model_dir, spec_decoding="ngram")) as engine:
        alone = [tokens(await generate(engine, *r)) for r in reqs]
        accepted_alone = engine.statistics()["spec_accepted_tokens"]
        together = await crowd(engine, reqs)
        stats = engine.statistics()
    async with running(tiny_config(tiny_model_dir)) as engine:
        plain = [tokens(d) for d in await crowd(engine, reqs)]
    assert all(alone)
    for i, (got, deltas, want) in enumerate(zip(alone, together, plain)):
        assert tokens(deltas) == got, f"request {i}: beside 31 others"
        assert got == want, f"request {i}: drafts off"
    # The crowd was one: most requests shared steps with many others; and drafts were kept in it.
    widest = [max(d[-1].usage.batch_size) for d in together if d[-1].usage is not None]
    assert len(widest) == 32 and sorted(widest)[16] > 16, widest
    assert accepted_alone > 0 and stats["spec_accepted_tokens"] > accepted_alone, stats
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0
