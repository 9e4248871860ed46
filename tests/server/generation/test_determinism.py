"""seed (Azure ML chat completions, MindIE completions): the same request with the same seed
gives the same text whether it runs alone or in a batch with 31 other requests; greedy likewise.

The other requests differ in prompt, seed, length and sampling settings, and start staggered,
so the probe's steps are shared with prefills, decodes and finishing requests.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from tests.support.http import complete
from tests.support.reference import Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread

PROBES: list[dict[str, Any]] = [
    {"prompt": "The quick brown", "temperature": 1.0, "top_p": 0.9, "seed": 424242},
    {"prompt": "Paged attention", "temperature": 0.7, "top_k": 20, "seed": 7},
    {"prompt": "def add(a, b):", "temperature": 0},
]
COMMON = {"max_tokens": 16, "ignore_eos": True}


async def test_same_seed_same_text_alone_or_beside_31_others(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    alone = [(await complete(http, **probe, **COMMON))["choices"][0]["text"] for probe in PROBES]
    greedy = await in_thread(ref.greedy, ref.encode(PROBES[2]["prompt"]), 16)
    assert alone[2] == ref.decode(greedy)
    # A different seed gives a different text (the seed is actually used).
    other = (await complete(http, **{**PROBES[0], "seed": 424243}, **COMMON))["choices"][0]["text"]
    assert other != alone[0]

    crowd: dict[int, str] = {}
    batches: dict[int, list[int]] = {}

    async def noise(i: int) -> None:
        await trio.sleep(0.003 * i)
        body = {
            "prompt": f"Background request number {i} with its own words",
            "temperature": [1.0, 0.5, 0.0, 1.3][i % 4],
            "top_p": 0.8 if i % 3 == 0 else 1.0,
            "max_tokens": 8 + (i % 5) * 4,
            "ignore_eos": True,
            "seed": 1000 + i,
            "frequency_penalty": 0.5 if i % 7 == 0 else 0.0,
        }
        await complete(http, **body)

    async def probe(k: int) -> None:
        await trio.sleep(0.01 * (k + 1))
        out = await complete(http, **PROBES[k], **COMMON)
        crowd[k], batches[k] = out["choices"][0]["text"], out["usage"]["batch_size"]

    async with trio.open_nursery() as nursery:
        for i in range(32 - len(PROBES)):
            nursery.start_soon(noise, i)
        for k in range(len(PROBES)):
            nursery.start_soon(probe, k)
    assert [crowd[k] for k in range(len(PROBES))] == alone
    assert all(max(b) > 4 for b in batches.values()), batches  # they really were in a crowd


async def test_seeded_n_is_reproducible_in_a_crowd(server: Server, http: httpx.AsyncClient) -> None:
    body = {"prompt": "The quick brown", "n": 3, "temperature": 1.0, "top_p": 0.9, "seed": 99, **COMMON}
    alone = sorted((c["index"], c["text"]) for c in (await complete(http, **body))["choices"])
    results: list[list[tuple[int, str]]] = []

    async def one(i: int) -> None:
        if i % 2:
            out = await complete(http, **body)
            results.append(sorted((c["index"], c["text"]) for c in out["choices"]))
        else:
            await complete(http, prompt=f"noise {i}", temperature=1.0, seed=i + 1, **COMMON)  # MindIE completions: seeds are > 0

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
    assert results == [alone] * 4
