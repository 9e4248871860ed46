"""Speculative decoding under a grammar: each verify row is masked by the matcher advanced over
the draft before it, so a guided request drafts and still gets exactly its step-by-step tokens.

Greedy and seeded requests under a regular expression (text that repeats, which n-gram drafts
catch) and under JSON mode run concurrently with drafting on and off: the same tokens, the
regex's text valid, drafts kept, and every block and runner state back at the end.
"""

from __future__ import annotations

import re
from pathlib import Path

import trio
from transformers import AutoTokenizer

from runtime.sampling import Guide, SamplingParams
from tests.support.servers import tiny_config
from tests.support.spec import generate, running, tokens

PHRASE = "hello world "
REPEATING = Guide(kind="regex", definition=f"({PHRASE})+", param="response_format")
REQUESTS = [
    ([5, 6, 7, 5, 6, 7], SamplingParams(temperature=0.0, max_tokens=40, guide=REPEATING)),
    ([12, 13, 14], SamplingParams(temperature=0.9, seed=3, max_tokens=40, guide=REPEATING)),
    ([20, 21, 20, 21, 20, 21], SamplingParams(temperature=0.0, max_tokens=40, guide=Guide(kind="json_object", param="response_format"))),
    ([30, 31, 32], SamplingParams(temperature=0.8, seed=4, max_tokens=40, guide=Guide(kind="json_object", param="response_format"))),
]


async def run(model_dir: Path, spec: str) -> tuple[list[list[int]], dict, int]:
    async with running(tiny_config(model_dir, spec_decoding=spec)) as engine:
        results: list[list[int]] = [[] for _ in REQUESTS]

        async def one(i: int) -> None:
            results[i] = tokens(await generate(engine, *REQUESTS[i], stagger=0.01 * i))

        async with trio.open_nursery() as clients:
            for i in range(len(REQUESTS)):
                clients.start_soon(one, i)
        assert len(tokens(await generate(engine, [9, 9], SamplingParams(max_tokens=2, ignore_eos=True)))) == 2  # its plan frees the others' runner state
        return results, engine.statistics(), len(engine.runner.requests)


async def test_guided_drafts_change_no_token(tiny_model_dir: Path) -> None:
    plain, _, _ = await run(tiny_model_dir, "off")
    drafted, stats, kept = await run(tiny_model_dir, "ngram")  # by name: this float32 model's steps are not row-invariant, so auto would not draft
    assert drafted == plain and all(plain)
    assert stats["spec_accepted_tokens"] > 0, stats
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for ids in drafted[:2]:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        assert re.fullmatch(f"({PHRASE})*", text[: len(text) - len(text) % len(PHRASE)]) and PHRASE.startswith(text[len(text) - len(text) % len(PHRASE) :]), text
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0 and kept == 1



async def test_a_kept_end_of_text_inside_a_draft_ends_the_guided_request(tiny_model_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The prompt repeats "hello world", the end-of-text token, a newline, so n-gram drafts carry
    the end of text and text after it where a fixed-string grammar is complete. The verify row
    that keeps the end of text completes the grammar; the rows after it sample past the end, and
    must not reach the finished matcher (it refused them: a grammar error and an HTTP 500). Each
    request ends as it does without drafting."""
    from tests.support.spec import always_draft

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    line = [*tokenizer("hello world")["input_ids"], tokenizer.eos_token_id, *tokenizer("\n")["input_ids"]]
    fixed = Guide(kind="regex", definition="hello world", param="response_format")
    outputs = {}
    for spec in ("off", "ngram"):
        if spec == "ngram":
            always_draft(monkeypatch)
        async with running(tiny_config(tiny_model_dir, spec_decoding=spec)) as engine:
            for seed in range(6):
                sampling = SamplingParams(temperature=0.0 if seed == 0 else 1.0, seed=seed, max_tokens=20, guide=fixed)
                deltas = await generate(engine, line * 6, sampling)  # a grammar error raises RequestFailed here
                outputs.setdefault(spec, []).append((tokenizer.decode(tokens(deltas), skip_special_tokens=True), deltas[-1].finish_reason))
            stats = engine.statistics()
    assert outputs["ngram"] == outputs["off"] and all(text == "hello world" for text, _ in outputs["off"]), outputs
    assert stats["spec_accepted_tokens"] > 0, stats
