"""n / best_of siblings prefill the prompt once and fork its KV (copy-on-write), on the real engine.

The tiny random Llama runs with 4-token blocks, so a prompt of 4k + r tokens exercises both
shared full blocks and the copied, partly filled last block. The engine's own counter
(`prefill_tokens`: prompt tokens computed, not served from a cache) must grow by exactly one
prompt per request, whatever n is. Each sibling's continuation must equal a lone request
with that sibling's seed: a wrong block copy, a wrong first draw or a shared block written
by two sequences would change some sibling's text.
"""

from __future__ import annotations

import random

import httpx
import pytest

from tests.support.http import complete
from tests.support.servers import Server
from tests.support.waiting import settled_statistics


async def prefill_tokens(server: Server) -> int:
    """The engine's counter once nothing is in flight (read across the socket with --engine-process)."""
    return int((await settled_statistics(server.runtime))["prefill_tokens"])


@pytest.mark.parametrize("length", [37, 40])  # a partly filled last block, and none
@pytest.mark.parametrize("extra", [{}, {"echo": True, "logprobs": 2}])
async def test_n_prefills_the_prompt_once_and_siblings_match_lone_requests(
    server: Server, http: httpx.AsyncClient, length: int, extra: dict
) -> None:
    prompt = [random.Random(length).randrange(3, 300) for _ in range(length)]
    body = dict(prompt=prompt, max_tokens=12, temperature=1.0, seed=77, ignore_eos=True, **extra)
    before = await prefill_tokens(server)
    together = await complete(http, n=4, **body)
    assert await prefill_tokens(server) - before == length
    texts = [c["text"] for c in sorted(together["choices"], key=lambda c: c["index"])]
    assert len(set(texts)) > 1, "precondition: sampled siblings should differ"
    # Sibling i of a seeded request samples with seed + i.
    alone = [(await complete(http, **{**body, "seed": 77 + i}))["choices"][0]["text"] for i in range(4)]
    assert texts == alone
    if extra:
        # Every sibling carries the prompt's logprobs, computed once.
        echoed = [c["logprobs"]["token_logprobs"][1:length] for c in together["choices"]]
        assert all(e == echoed[0] for e in echoed)
    stats = await settled_statistics(server.runtime)
    assert stats["running"] == stats["waiting"] == stats["kv_blocks_used"] == 0


async def test_best_of_prefills_once(server: Server, http: httpx.AsyncClient) -> None:
    prompt = list(range(5, 5 + 29))
    before = await prefill_tokens(server)
    out = await complete(http, prompt=prompt, n=1, best_of=4, max_tokens=6, temperature=1.0, seed=3, ignore_eos=True)
    assert len(out["choices"]) == 1
    assert out["usage"]["completion_tokens"] == 4 * 6
    assert await prefill_tokens(server) - before == len(prompt)
