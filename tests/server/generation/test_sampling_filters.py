"""temperature, top_k and top_p do what they say, read back through Chat logprobs.

Chat logprobs report the raw model distribution (a list, so tokens whose text collides stay
apart): every sampled token must lie inside the filter computed from those numbers.
"""

from __future__ import annotations

import math

import httpx

from tests.support.http import chat, complete
from tests.support.reference import Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread

MESSAGES = [{"role": "user", "content": "The quick brown"}]


async def test_top_k_keeps_sampling_inside_the_k_most_likely(server: Server, http: httpx.AsyncClient) -> None:
    out = await chat(http, messages=MESSAGES, max_tokens=24, temperature=2.0, top_k=3, seed=17, ignore_eos=True, logprobs=True, top_logprobs=3)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == 24
    for j, entry in enumerate(content):
        assert entry["logprob"] >= min(t["logprob"] for t in entry["top_logprobs"]) - 1e-6, (j, entry)
    # At temperature 2 without top_k the same seed leaves the top 3 somewhere in 24 tokens.
    free = await chat(http, messages=MESSAGES, max_tokens=24, temperature=2.0, seed=17, ignore_eos=True, logprobs=True, top_logprobs=3)
    outside = [e for e in free["choices"][0]["logprobs"]["content"] if e["logprob"] < min(t["logprob"] for t in e["top_logprobs"]) - 1e-6]
    assert outside, "precondition: unfiltered sampling should leave the top 3 at least once"


async def test_top_p_keeps_sampling_inside_the_nucleus(server: Server, http: httpx.AsyncClient) -> None:
    top_p = 0.3
    out = await chat(http, messages=MESSAGES, max_tokens=24, temperature=1.0, top_p=top_p, seed=23, ignore_eos=True, logprobs=True, top_logprobs=20)
    for j, entry in enumerate(out["choices"][0]["logprobs"]["content"]):
        # The nucleus: tokens whose preceding mass (best first) is below top_p.
        probs = [math.exp(t["logprob"]) for t in entry["top_logprobs"]]
        before, floor = 0.0, None
        for p, t in zip(probs, entry["top_logprobs"]):
            if before >= top_p:
                break
            floor = t["logprob"]
            before += p
        assert before >= top_p, (j, "nucleus wider than 20 tokens: cannot check")
        assert entry["logprob"] >= floor - 1e-6, (j, entry["logprob"], floor)


async def test_degenerate_filters_are_greedy_and_wide_ones_are_off(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    prompt = ref.encode("The quick brown")
    greedy = ref.decode(await in_thread(ref.greedy, prompt, 12))
    base = dict(prompt=prompt, max_tokens=12, ignore_eos=True)
    for fields in ({"temperature": 0}, {"temperature": 1.5, "top_k": 1, "seed": 1}, {"temperature": 1.5, "top_p": 1e-6, "seed": 2}):
        assert (await complete(http, **base, **fields))["choices"][0]["text"] == greedy, fields
    # top_k past the vocabulary and top_p 1 filter nothing: same text as no filter, same seed.
    free = (await complete(http, **base, temperature=1.5, seed=3))["choices"][0]["text"]
    assert free != greedy
    for fields in ({"top_k": 10**6}, {"top_k": -1}, {"top_p": 1.0}):
        assert (await complete(http, **base, temperature=1.5, seed=3, **fields))["choices"][0]["text"] == free, fields
