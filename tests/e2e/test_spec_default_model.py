"""n-gram drafts on the embedded default model (slow, real weights): the same greedy tokens.

The shipped SmolLM2-135M-Instruct (its Q4_1 GGUF, here the float32 upcast `default_config()`
serves) on grounded prompts, text whose continuation quotes the prompt, where drafts are kept:
greedy tokens with drafts equal those without, and drafts were kept. One engine serves both
(loading the model twice would double the test's time): drafting is switched off, then forced
on for every step (tests/support/spec.py `DraftSwitch`; whether drafting pays is measured on
this machine's steps, which a busy CI machine would make a coin toss). Each request runs alone,
after a first pass that leaves its prompt in the prefix cache, so both passes compute the same
uncached tail of the prompt: the only difference between them is the drafts' verify rows.

(The shipped Q4_1 blocks themselves, `--quantization shipped`, run a 5-row verify step on the
int8 GEMM and a 1-row step on the int4 kernel, so identity there is not guaranteed by design;
a one-off run of these prompts gave identical tokens too.)
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from runtime.model_store import resolve_model
from runtime.sampling import SamplingParams
from tests.support.servers import default_config
from tests.support.spec import DraftSwitch, generate, running, tokens

pytestmark = pytest.mark.slow

PROMPTS = [
    'Text: "Paged attention keeps keys and values in fixed-size blocks, so a serving engine wastes little memory and can share '
    'a prompt\'s blocks between requests."\nThe same text, copied exactly: "Paged attention',
    "Repeat after me: The quick brown fox jumps over the lazy dog, and the lazy dog sleeps in the warm afternoon sun.\nThe quick brown fox",
]
NUM_NEW = 24


async def test_greedy_tokens_are_the_same_with_drafts_on_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    drafts = DraftSwitch(monkeypatch, on=False)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(None)[1])
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_NEW)
    async with running(default_config(spec_decoding="ngram")) as engine:
        for p in prompts:  # the prompts' blocks into the prefix cache
            await generate(engine, p, SamplingParams(temperature=0.0, max_tokens=1))
        plain = [tokens(await generate(engine, p, greedy)) for p in prompts]
        assert engine.statistics()["spec_draft_tokens"] == 0
        drafts.on = True
        drafted = [tokens(await generate(engine, p, greedy)) for p in prompts]
        stats = engine.statistics()
    for i, (want, got) in enumerate(zip(plain, drafted)):
        assert got == want, f"prompt {i}: {tokenizer.decode(got)!r} != {tokenizer.decode(want)!r}"
    assert stats["spec_accepted_tokens"] > 0 and stats["kv_blocks_used"] == 0, stats
