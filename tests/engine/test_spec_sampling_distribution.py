"""Sampling with n-gram drafts draws from the same distribution as without them.

Seeded requests give identical tokens with drafts on and off (tests/engine/test_spec_decoding.py
and test_spec_seeded_crowd.py); that alone would also hold for a verify step that reused the
same uniform but a wrong rule for keeping a draft token. So here two samples of different seeds
are compared by Pearson's chi-square (tests/support/stats.py): 384 sequences with drafts off,
384 others with drafts on, at temperature 1 over each position's top 2 tokens (a tiny effective
vocabulary, so the counts are dense). Two statistics, each at a Bonferroni share of 0.001:
  - the token at a few positions;
  - per sequence, how many of its tokens repeat what the n-gram drafter would have proposed
    there (what a wrong acceptance rule inflates; a function of the output alone, so defined
    with drafts off too).
The seeds are fixed, so each p-value is a fixed number, not a draw that could flake.

For drafts to be proposed at most steps the prompt is the model's own sampled text (a random
model's samples rarely repeat, but they repeat its own earlier ones), and each wave of 64
sequences is one request with n = 64: admitted in one step, so no step has requests waiting
(which turns drafting off) and the drafts, like the p-values, are the same on every run.

The check must fail when the acceptance rule is wrong: a planted rule that keeps a rejected
draft token half of the time is rejected with p far below 1e-6.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from actors.runners.torch_runner import TorchRunner
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config
from tests.support.spec import always_draft, generate, running, tokens
from tests.support.stats import homogeneity

ALPHA = 0.001
SEQUENCES, WAVE, NEW = 384, 64, 8
POSITIONS = (1, 3, 5, 7)  # 0 comes from the prompt's step, never from a verify row


def sampling(seed: int, max_tokens: int = NEW, n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_k=2, seed=seed, max_tokens=max_tokens, ignore_eos=True, n=n)


async def sample(model_dir: Path, spec: str, first_seed: int, prompt: list[int] | None = None) -> tuple[list[int], list[list[int]], dict[str, Any]]:
    """(prompt, SEQUENCES outputs with seeds first_seed.., the engine's statistics). Without a
    prompt, the model's own 125 sampled tokens after [5, 6, 7]."""
    async with running(tiny_config(model_dir, spec_decoding=spec, max_num_seqs=WAVE, max_num_batched_tokens=512, num_kv_blocks=1024)) as engine:
        if prompt is None:
            prompt = [5, 6, 7] + tokens(await generate(engine, [5, 6, 7], sampling(seed=12345, max_tokens=125)))
        outputs = []
        for first in range(first_seed, first_seed + SEQUENCES, WAVE):  # sibling i's seed is first + i
            for stream in engine.open_many(Prompt(token_ids=prompt), sampling(first, n=WAVE), WAVE):
                outputs.append([t async for delta in stream for t in delta.token_ids])
                stream.close()
        return prompt, outputs, engine.statistics()


def repeats(prompt: list[int], output: list[int]) -> int:
    """How many of `output`'s tokens are what followed the latest earlier occurrence of the 4, 3
    or 2 tokens before them (the prompt-lookup guess; here, not the drafter's own index, so the
    statistic stays a fixed function of the text whatever the drafter becomes)."""
    history, after = list(prompt), {}  # n-gram -> the position just after its latest occurrence

    def index(end: int) -> None:
        for n in (4, 3, 2):
            if end >= n:
                after[tuple(history[end - n : end])] = end

    for end in range(1, len(history)):  # every n-gram ending before the last token
        index(end)
    count = 0
    for token in output:
        keys = [tuple(history[-n:]) for n in (4, 3, 2) if len(history) > n]
        guess = next((history[after[key]] for key in keys if key in after), None)
        count += guess == token
        history.append(token)
        index(len(history) - 1)
    return count


def p_values(prompt: list[int], plain: list[list[int]], drafted: list[list[int]]) -> dict[str, float]:
    out = {f"token {i}": homogeneity([o[i] for o in plain], [o[i] for o in drafted])[2] for i in POSITIONS}
    out["repeats"] = homogeneity([repeats(prompt, o) for o in plain], [repeats(prompt, o) for o in drafted])[2]
    return out


async def test_drafted_sampling_has_the_distribution_of_plain_sampling(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    always_draft(monkeypatch)
    prompt, plain, _ = await sample(tiny_model_dir, "off", 0)
    _, drafted, stats = await sample(tiny_model_dir, "ngram", SEQUENCES, prompt)
    assert all(len(o) == NEW for o in plain + drafted)
    # Drafts were verified at most steps, and kept: the verify rows drew these tokens.
    assert stats["spec_draft_tokens"] > SEQUENCES * 2 and stats["spec_accepted_tokens"] > SEQUENCES, stats
    p = p_values(prompt, plain, drafted)
    assert min(p.values()) > ALPHA / len(p), p


async def test_a_wrong_acceptance_rule_fails_the_check(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has power: keep a draft token half of the time whatever was sampled."""
    always_draft(monkeypatch)
    sample_rows = TorchRunner._sample_rows
    coin = random.Random(0)

    def planted(self: TorchRunner, all_logits: Any, draws: Any, params: Any, mask_of: Any, allowed: Any, which: Any) -> list[int | None]:
        drawn = sample_rows(self, all_logits, draws, params, mask_of, allowed, which)
        return [draws[i].checks if draws[i].checks is not None and coin.random() < 0.5 else t for t, i in zip(drawn, list(which))]

    prompt, plain, _ = await sample(tiny_model_dir, "off", 0)
    monkeypatch.setattr(TorchRunner, "_sample_rows", planted)
    _, drafted, stats = await sample(tiny_model_dir, "ngram", SEQUENCES, prompt)
    assert stats["spec_accepted_tokens"] > 0
    p = p_values(prompt, plain, drafted)
    assert min(p.values()) < 1e-6, p
