"""Logprobs, Chat and legacy Completions shapes, checked against a direct forward pass.

The engine reports log-softmax of the raw model logits (before temperature, penalties or
filters). The reference runs the prompt plus the generated tokens through transformers in
float32 and takes log_softmax; every reported number must agree within 1e-3.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.http import chat, complete, stream_events
from tests.support.reference import TOL, Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread

PROMPT = "The quick brown"


async def _legacy_greedy_echo(http: httpx.AsyncClient, ref: Reference, k: int) -> tuple[list[int], list[int], object, dict]:
    ids = ref.encode(PROMPT)
    greedy = await in_thread(ref.greedy, ids, 8)
    lp = await in_thread(ref.logprobs, ids + greedy)
    out = await complete(http, prompt=PROMPT, max_tokens=8, temperature=0, ignore_eos=True, logprobs=k, echo=True)
    choice = out["choices"][0]
    assert choice["text"] == PROMPT + ref.decode(greedy)
    return ids, greedy, lp, choice["logprobs"]


async def test_legacy_token_logprobs_match_the_model_with_echo(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    ids, greedy, lp, got = await _legacy_greedy_echo(http, ref, 3)
    n = len(ids)
    assert len(got["tokens"]) == len(got["token_logprobs"]) == len(got["top_logprobs"]) == len(got["text_offset"]) == n + 8
    assert got["tokens"] == [ref.token_text(t) for t in ids + greedy]

    # Prompt: the first token has no context; the others score the prompt token at p given < p.
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    for p in range(1, n):
        assert got["token_logprobs"][p] == pytest.approx(float(lp[p - 1, ids[p]]), abs=TOL), p
    # Generated: greedy, so each chosen token is the argmax of the raw distribution.
    for j, token in enumerate(greedy):
        row = lp[n + j - 1]
        assert got["token_logprobs"][n + j] == pytest.approx(float(row[token]), abs=TOL), j
        assert got["token_logprobs"][n + j] == pytest.approx(float(row.max()), abs=TOL), j

    # text_offset: the prompt starts at 0 and generated text right after the echoed prompt.
    assert got["text_offset"][0] == 0
    assert got["text_offset"][n] == len(PROMPT)
    assert got["text_offset"] == sorted(got["text_offset"])


async def test_legacy_top_logprobs_are_the_models_top_k(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """Each top_logprobs dict holds the k most likely tokens, keyed by text.

    Several byte-level tokens decode alone to the same text (U+FFFD). However such keys are
    rendered, every value must be one of the model's top-k logprobs and the best one must be
    there: a collision may merge entries but must never replace the most likely token's
    logprob by a lower one. At temperature 0 the chosen token is that best entry.
    """
    ids, greedy, lp, got = await _legacy_greedy_echo(http, ref, 3)
    n = len(ids)
    wrong = []
    for p in range(1, n + len(greedy)):
        best = lp[p - 1].topk(3).values.tolist()
        top = got["top_logprobs"][p]
        # The position's own token is listed too (logprobs + 1 entries, as MindIE and vLLM list them).
        own = got["token_logprobs"][p]
        values = sorted(top.values(), reverse=True)
        allowed = best + [own]
        if not all(any(abs(v - b) < TOL for b in allowed) for v in values) or abs(values[0] - best[0]) > TOL:
            wrong.append((p, top, best))
        elif p >= n and abs(top.get(got["tokens"][p], float("nan")) - best[0]) > TOL:
            wrong.append((p, got["tokens"][p], top, best))
    assert not wrong, wrong


async def test_legacy_top_logprobs_hold_the_sampled_token(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """MindIE completions' example: with logprobs=2, a sampled token outside the top 2 still appears in
    that position's top_logprobs (" to" beside "?" and "?”"), as vLLM returns up to logprobs+1.
    """
    out = await complete(http, prompt=PROMPT, max_tokens=16, temperature=1.5, seed=11, ignore_eos=True, logprobs=1)
    got = out["choices"][0]["logprobs"]
    for j, (token, top) in enumerate(zip(got["tokens"], got["top_logprobs"])):
        assert token in top, (j, token, top)
        assert top[token] >= got["token_logprobs"][j] - 1e-6, (j, token, top)  # another token may share its text


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


async def test_streamed_legacy_logprobs_equal_the_whole_response(server: Server, http: httpx.AsyncClient) -> None:
    """Every generated token's entry is streamed, including those whose text is still held
    back (an incomplete UTF-8 character): none may be dropped, offsets must line up."""
    body = dict(prompt=PROMPT, max_tokens=8, temperature=1.0, seed=8, ignore_eos=True, logprobs=2, echo=True)
    whole = (await complete(http, **body))["choices"][0]["logprobs"]
    events = await stream_events(http, "/v1/completions", **body)
    parts = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"] is not None]
    joined = {key: [v for part in parts for v in part[key]] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    # Floats within 1e-5: the second request's prompt comes partly from the prefix cache.
    assert joined["tokens"] == whole["tokens"]
    assert joined["text_offset"] == whole["text_offset"]
    assert _close(joined["token_logprobs"], whole["token_logprobs"]), (joined["token_logprobs"], whole["token_logprobs"])
    assert _close(joined["top_logprobs"], whole["top_logprobs"]), (joined["top_logprobs"], whole["top_logprobs"])


async def test_streamed_chat_logprobs_equal_the_whole_response(server: Server, http: httpx.AsyncClient) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    body = dict(messages=messages, max_tokens=8, temperature=1.0, seed=8, ignore_eos=True, logprobs=True, top_logprobs=2)
    whole_chat = (await chat(http, **body))["choices"][0]["logprobs"]["content"]
    events = await stream_events(http, "/v1/chat/completions", **body)
    streamed = [entry for e in events if e["choices"] and e["choices"][0]["logprobs"] for entry in e["choices"][0]["logprobs"]["content"]]
    assert len(streamed) == len(whole_chat)
    for j, (a, b) in enumerate(zip(streamed, whole_chat)):
        assert _close(a, b), (j, a, b)


def _close(a: object, b: object, tol: float = 1e-5) -> bool:
    """Equal structures, floats within `tol` (the same numbers from two runs)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_close(a[k], b[k], tol) for k in a)
    return a == b
