"""Logprobs, Chat and legacy Completions shapes, checked against a direct forward pass.

The engine reports log-softmax of the raw model logits (before temperature, penalties or
filters). The reference runs the prompt plus the generated tokens through transformers in
float32 and takes log_softmax; every reported number must agree within 1e-3.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Server
from tests.generation.helpers import TOL, Reference, chat, complete, in_thread

PROMPT = "The quick brown"


async def test_legacy_logprobs_match_the_model_greedy_with_echo(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    ids = ref.encode(PROMPT)
    greedy = await in_thread(ref.greedy, ids, 8)
    lp = await in_thread(ref.logprobs, ids + greedy)

    out = await complete(http, prompt=PROMPT, max_tokens=8, temperature=0, ignore_eos=True, logprobs=3, echo=True)
    choice = out["choices"][0]
    assert choice["text"] == PROMPT + ref.decode(greedy)
    got = choice["logprobs"]
    n = len(ids)
    assert len(got["tokens"]) == len(got["token_logprobs"]) == len(got["top_logprobs"]) == len(got["text_offset"]) == n + 8
    assert got["tokens"] == [ref.token_text(t) for t in ids + greedy]

    # Prompt: the first token has no context; the others score the prompt token at p given < p.
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    for p in range(1, n):
        assert got["token_logprobs"][p] == pytest.approx(float(lp[p - 1, ids[p]]), abs=TOL), p
        top = sorted(got["top_logprobs"][p].values(), reverse=True)
        assert top == pytest.approx(lp[p - 1].topk(len(top)).values.tolist(), abs=TOL), p

    # Generated: greedy, so the chosen token is the argmax and the first top entry.
    for j, token in enumerate(greedy):
        row = lp[n + j - 1]
        assert got["token_logprobs"][n + j] == pytest.approx(float(row[token]), abs=TOL), j
        assert got["token_logprobs"][n + j] == pytest.approx(float(row.max()), abs=TOL), j
        top = got["top_logprobs"][n + j]
        first_text, first_lp = next(iter(top.items()))
        assert first_text == ref.token_text(token), (j, top)
        assert first_lp == pytest.approx(got["token_logprobs"][n + j], abs=1e-6), (j, top)

    # text_offset: the prompt starts at 0 and generated text right after the echoed prompt.
    assert got["text_offset"][0] == 0
    assert got["text_offset"][n] == len(PROMPT)
    assert got["text_offset"] == sorted(got["text_offset"])


async def test_legacy_top_logprobs_hold_the_sampled_token(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """Seed 004's example: with logprobs=2, a sampled token outside the top 2 still appears in
    that position's top_logprobs (" to" beside "?" and "?”"), as vLLM returns up to logprobs+1.
    """
    out = await complete(http, prompt=PROMPT, max_tokens=16, temperature=1.5, seed=11, ignore_eos=True, logprobs=1)
    got = out["choices"][0]["logprobs"]
    for j, (token, top) in enumerate(zip(got["tokens"], got["top_logprobs"])):
        assert token in top, (j, token, top)
        assert top[token] == pytest.approx(got["token_logprobs"][j], abs=1e-6)


async def test_sampled_logprobs_are_raw_model_logprobs(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """At temperature 1.5 with top_k/top_p the reported logprob is still the unscaled model's."""
    ids = ref.encode(PROMPT)
    out = await complete(http, prompt=PROMPT, max_tokens=10, temperature=1.5, top_p=0.95, top_k=40, seed=3, ignore_eos=True, logprobs=2)
    got = out["choices"][0]["logprobs"]
    assert len(got["tokens"]) == 10

    def check() -> None:
        by_text: dict[str, list[int]] = {}
        for t in range(len(ref.tokenizer)):
            by_text.setdefault(ref.token_text(t), []).append(t)
        seq = list(ids)
        for j, (text, reported) in enumerate(zip(got["tokens"], got["token_logprobs"])):
            row = ref.logprobs(seq)[-1]
            # Which token was sampled: the one with this text whose raw logprob is the reported one.
            matches = [t for t in by_text[text] if abs(float(row[t]) - reported) < TOL]
            assert matches, (j, text, reported, [float(row[t]) for t in by_text[text]])
            # The top entries are the raw distribution's top entries.
            top = sorted(got["top_logprobs"][j].values(), reverse=True)[: 2]
            assert top[0] == pytest.approx(float(row.max()), abs=TOL), j
            seq.append(matches[0])

    await in_thread(check)


async def test_chat_logprobs_match_the_model_and_top_first_is_chosen(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    ids = ref.chat_ids(messages)
    greedy = await in_thread(ref.greedy, ids, 10)
    lp = await in_thread(ref.logprobs, ids + greedy)

    out = await chat(http, messages=messages, max_tokens=10, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=4)
    assert out["usage"]["prompt_tokens"] == len(ids)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == 10
    for j, (entry, token) in enumerate(zip(content, greedy)):
        row = lp[len(ids) + j - 1]
        assert entry["token"] == ref.token_text(token), j
        assert entry["logprob"] == pytest.approx(float(row[token]), abs=TOL), j
        top = entry["top_logprobs"]
        assert len(top) == 4
        assert top[0]["token"] == entry["token"] and top[0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-6), j
        assert [t["logprob"] for t in top] == pytest.approx(row.topk(4).values.tolist(), abs=TOL), j
        assert [t["token"] for t in top] == [ref.token_text(t) for t in row.topk(4).indices.tolist()], j

    # logprobs without top_logprobs: the chosen token only, no alternatives.
    out = await chat(http, messages=messages, max_tokens=3, temperature=0, ignore_eos=True, logprobs=True)
    assert [e["top_logprobs"] for e in out["choices"][0]["logprobs"]["content"]] == [[], [], []]
    # Not asked: null.
    out = await chat(http, messages=messages, max_tokens=3, temperature=0)
    assert out["choices"][0]["logprobs"] is None


async def test_chat_logprob_bytes_rebuild_the_content(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """OpenAI: `bytes` is the token's UTF-8 bytes, "useful in instances where characters are
    represented by multiple tokens and their byte representations must be combined to generate
    the correct text representation". Joined, they must decode to the content.
    """
    messages = [{"role": "user", "content": "hello there"}]
    ids = ref.chat_ids(messages)
    greedy = await in_thread(ref.greedy, ids, 10)
    out = await chat(http, messages=messages, max_tokens=10, temperature=0, ignore_eos=True, logprobs=True)
    content = out["choices"][0]["message"]["content"]
    assert content == ref.decode(greedy)
    entries = out["choices"][0]["logprobs"]["content"]
    joined = b"".join(bytes(e["bytes"]) for e in entries)
    assert joined.decode("utf-8", errors="replace") == content, (joined, content)
