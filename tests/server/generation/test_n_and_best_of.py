"""n, best_of and prompt lists (the Databricks Completions request, MindIE completions), and the prompt they share.

Choice `index` is prompt_index * n + i. best_of > n generates best_of sequences and returns
the n with the highest cumulative logprob. The n (or best_of) sequences of one prompt are
prefilled once: siblings wait for the first sequence's prompt and reuse its KV blocks through
the prefix cache, which the engine's own `prefill_tokens` counter shows.
"""

from __future__ import annotations

import random

import httpx
import openai
import pytest

from tests.support.http import complete
from tests.support.reference import TOL, Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread, settled_statistics

PROMPTS = ["The quick brown", "Paged attention keeps"]


async def test_prompt_list_times_n_gives_indexed_choices(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    out = await complete(http, prompt=PROMPTS, n=3, echo=True, max_tokens=5, temperature=1.0, seed=7, ignore_eos=True)
    choices = out["choices"]
    assert sorted(c["index"] for c in choices) == list(range(6))
    for c in choices:
        assert c["text"].startswith(PROMPTS[c["index"] // 3]), c
        assert c["finish_reason"] == "length"
    prompt_lens = [len(ref.encode(p)) for p in PROMPTS]
    assert out["usage"]["prompt_tokens"] == sum(prompt_lens)  # each prompt once, not once per choice
    assert out["usage"]["completion_tokens"] == 6 * 5
    assert out["usage"]["total_tokens"] == sum(prompt_lens) + 30
    # Seeded siblings differ from one another (each sequence has its own random stream)...
    for p in range(2):
        texts = [c["text"] for c in choices if c["index"] // 3 == p]
        assert len(set(texts)) > 1, texts
    # ...and the whole request is reproducible.
    again = await complete(http, prompt=PROMPTS, n=3, echo=True, max_tokens=5, temperature=1.0, seed=7, ignore_eos=True)
    assert {c["index"]: c["text"] for c in again["choices"]} == {c["index"]: c["text"] for c in choices}

    # Token-id prompt lists index the same way; greedy through sampling (top_k=1) makes every
    # sibling the prompt's greedy continuation.
    ids = [ref.encode(p) for p in PROMPTS]
    out = await complete(http, prompt=ids, n=2, max_tokens=6, temperature=1.0, top_k=1, ignore_eos=True)
    greedy = [await in_thread(ref.greedy, p, 6) for p in ids]
    assert {c["index"]: c["text"] for c in out["choices"]} == {i: ref.decode(greedy[i // 2]) for i in range(4)}


async def test_n_siblings_sharing_prompt_blocks_continue_correctly(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """Siblings start from the first sequence's cached prompt blocks: their continuation must
    be the same as a lone request's (greedy via top_k=1, so all four must agree)."""
    rng = random.Random(5)
    prompt = [rng.randrange(3, 300) for _ in range(41)]
    greedy = await in_thread(ref.greedy, prompt, 10)
    out = await complete(http, prompt=prompt, n=4, max_tokens=10, temperature=1.0, top_k=1, ignore_eos=True)
    assert [c["text"] for c in sorted(out["choices"], key=lambda c: c["index"])] == [ref.decode(greedy)] * 4
    # Sampled siblings, though, each draw their own tokens.
    sampled = await complete(http, prompt=prompt, n=4, max_tokens=10, temperature=1.0, seed=9, ignore_eos=True)
    texts = [c["text"] for c in sorted(sampled["choices"], key=lambda c: c["index"])]
    assert len(set(texts)) > 1


async def test_best_of_returns_the_n_most_likely(server: Server, http: httpx.AsyncClient) -> None:
    body = dict(prompt="The quick brown", max_tokens=8, temperature=1.0, seed=1234, ignore_eos=True)
    # The four candidates best_of=4 draws: n=4 with the same seed runs the same four sequences.
    all4 = await complete(http, n=4, logprobs=0, **body)
    scored = sorted(
        ((sum(c["logprobs"]["token_logprobs"]), c["text"]) for c in all4["choices"]), reverse=True
    )
    assert len({t for _, t in scored}) > 1, "precondition: the four samples should differ"

    best = await complete(http, n=2, best_of=4, **body)
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert [c["text"] for c in best["choices"]] == [t for _, t in scored[:2]]
    assert all(c["logprobs"] is None for c in best["choices"])  # not asked for: not returned
    assert best["usage"]["completion_tokens"] == 4 * 8  # every sequence generated is billed

    ranked = await complete(http, n=2, best_of=4, logprobs=0, **body)
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in ranked["choices"]]
    assert sums == sorted(sums, reverse=True)
    assert sums == pytest.approx([s for s, _ in scored[:2]], abs=TOL)

    one = await complete(http, n=1, best_of=4, **body)
    assert [c["text"] for c in one["choices"]] == [scored[0][1]]


async def test_echo_prompt_logprobs_for_every_sibling(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """Prompt logprobs need the prompt computed; a sibling served from the cache still gets them."""
    ids = ref.encode("Paged attention keeps keys")
    lp = await in_thread(ref.logprobs, ids)
    out = await complete(http, prompt=ids, n=2, echo=True, logprobs=1, max_tokens=3, temperature=1.0, seed=3, ignore_eos=True)
    expected = [None] + [float(lp[p - 1, ids[p]]) for p in range(1, len(ids))]
    for c in out["choices"]:
        got = c["logprobs"]["token_logprobs"][: len(ids)]
        assert got[0] is None
        assert got[1:] == pytest.approx(expected[1:], abs=TOL), c["index"]


def _prompt_of(length: int, first: int) -> list[int]:
    rng = random.Random(42)
    return [first] + [rng.randrange(3, 300) for _ in range(length - 1)]


@pytest.mark.parametrize("fields", [{"n": 4}, {"n": 1, "best_of": 4}, {"n": 2, "best_of": 4}])
async def test_siblings_prefill_the_prompt_once(server: Server, http: httpx.AsyncClient, fields: dict) -> None:
    length = 40
    block = server.config.block_size
    before = (await settled_statistics(server.runtime))["prefill_tokens"]
    await complete(http, prompt=_prompt_of(length, 10), max_tokens=4, temperature=1.0, seed=1, ignore_eos=True)
    single = (await settled_statistics(server.runtime))["prefill_tokens"] - before
    assert single == length

    before = (await settled_statistics(server.runtime))["prefill_tokens"]
    # Another first token: nothing of this prompt is in the prefix cache yet.
    out = await complete(http, prompt=_prompt_of(length, 11), max_tokens=4, temperature=1.0, seed=1, ignore_eos=True, **fields)
    delta = (await settled_statistics(server.runtime))["prefill_tokens"] - before
    extra = fields.get("best_of", fields["n"]) - 1
    assert len(out["choices"]) == fields["n"]
    assert out["usage"]["completion_tokens"] == 4 * (extra + 1)
    assert length <= delta <= length + extra * block, (fields, delta)
    assert out["usage"]["prompt_tokens"] == length  # billed once


async def test_cached_tokens_are_part_of_the_prompt_tokens(server: Server, http: httpx.AsyncClient) -> None:
    """usage.prompt_tokens counts a shared prompt once; prompt_tokens_details.cached_tokens
    ("cached tokens present in the prompt", OpenAI) must then be part of that count, not a sum
    over the siblings that reused the first sequence's blocks."""
    prompt = _prompt_of(40, 12)
    out = await complete(http, prompt=prompt, n=4, max_tokens=2, temperature=1.0, seed=1, ignore_eos=True)
    usage = out["usage"]
    assert usage["prompt_tokens"] == 40
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"], usage
    # Sent again, the whole prompt (bar the last block) is cached, still at most the prompt.
    again = (await complete(http, prompt=prompt, n=4, max_tokens=2, temperature=1.0, seed=1, ignore_eos=True))["usage"]
    assert 0 < again["prompt_tokens_details"]["cached_tokens"] <= again["prompt_tokens"], again


@pytest.mark.in_process  # makes the scheduler's core count one block fewer
async def test_cached_tokens_are_the_scheduler_cores_count(
    server: Server, http: httpx.AsyncClient, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests sharing a prefix: the second is served the prefix's full blocks from the
    cache, and `usage.prompt_tokens_details.cached_tokens` is the count the scheduler core
    kept for it (Sequence.num_cached_tokens, carried to the detokenizer in RegisterRequest).
    A core that counted one block fewer changes what the client sees: nothing else counts."""
    from actors.sched_core import SchedulerCore

    block = server.config.block_size
    shared = _prompt_of(6 * block, 13)
    first = await complete(http, prompt=shared + [7, 8, 9], max_tokens=2, temperature=0, ignore_eos=True)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a fresh server
    second = await complete(http, prompt=shared + [10, 11, 12], max_tokens=2, temperature=0, ignore_eos=True)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 6 * block

    counted: dict[str, int] = {}
    attach = SchedulerCore._attach_cached_prefix

    def one_block_fewer(core: SchedulerCore, seq: object) -> None:
        attach(core, seq)
        if not seq.admitted and seq.num_cached_tokens:  # type: ignore[attr-defined]
            seq.num_cached_tokens -= block  # type: ignore[attr-defined]
            counted[seq.request_id] = seq.num_cached_tokens  # type: ignore[attr-defined]

    monkeypatch.setattr(SchedulerCore, "_attach_cached_prefix", one_block_fewer)
    third = await in_thread(client.completions.create, model="tiny", prompt=shared + [14, 15], max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    assert list(counted.values()) == [5 * block]
    assert third.usage.prompt_tokens_details.cached_tokens == 5 * block
