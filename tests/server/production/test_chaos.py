"""Chaos: 64 concurrent streams on the real tiny model, half of them leaving at random points.

Afterwards nothing is left anywhere (no live request, scheduler queue, KV block, detokenizer
state or mailbox: they all hang off `Runtime.requests`; no message in any inbox), and every
stream that stayed got exactly what a lone request with the same prompt gets.
"""

from __future__ import annotations

import json
import random

import httpx
import trio

from tests.support.http import serves_normally
from tests.support.servers import Server
from tests.support.waiting import leaks, wait_idle

NUM_STREAMS = 64
MAX_TOKENS = 24
LEAVER_MAX_TOKENS = 450  # were leavers not aborted, the engine would run ~450 more steps
PROMPTS = [
    "The quick brown fox",
    "Switchyard serves language models",
    "Paged attention keeps keys and values in fixed-size blocks.",
    "def add(a, b):",
    "Héllo wörld",
    "continuous batching",
    "The lazy dog",
    "emoji 😀 too",
]


async def test_64_streams_half_disconnecting_leave_nothing_behind(server: Server) -> None:
    rng = random.Random(1234)
    leaving = set(rng.sample(range(NUM_STREAMS), NUM_STREAMS // 2))
    # Where each leaver goes: before the response starts (0: while queued or tokenizing), or
    # after that many SSE events.
    leave_at = {i: rng.choice([0, 1, 2, 3, 5, 8, 13, 20]) for i in leaving}
    completed: dict[int, str] = {}
    left: list[int] = []

    async def one(http: httpx.AsyncClient, i: int) -> None:
        max_tokens = LEAVER_MAX_TOKENS if i in leaving else MAX_TOKENS
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        await trio.sleep(rng.random() * 0.05)
        if leave_at.get(i) == 0:
            with trio.move_on_after(rng.random() * 0.03):
                async with http.stream("POST", "/v1/completions", json=body) as resp:
                    await resp.aread()
            left.append(i)
            return
        text, events = "", 0
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events += 1
                if i in leave_at and events >= leave_at[i]:
                    left.append(i)
                    return  # leaving the block closes the connection mid-stream
                if line == "data: [DONE]":
                    break
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text += chunk["choices"][0]["text"]
                if chunk["choices"][0]["finish_reason"] is not None:
                    assert chunk["choices"][0]["finish_reason"] == "length"
        completed[i] = text

    limits = httpx.Limits(max_connections=NUM_STREAMS + 4)
    with trio.fail_after(90):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60, limits=limits) as http:
            async with trio.open_nursery() as nursery:
                for i in range(NUM_STREAMS):
                    nursery.start_soon(one, http, i)
    assert len(left) + len(completed) == NUM_STREAMS
    assert len(completed) >= NUM_STREAMS // 2

    await wait_idle(server.runtime)
    assert leaks(server.runtime) == {}
    assert server.runtime.requests == {}  # type: ignore[attr-defined]
    # Idle because the leavers were aborted, not because they ran to their 450 tokens.
    assert server.runtime.statistics()["steps"] < 300  # type: ignore[attr-defined]

    # The survivors got exactly what a lone request gets (greedy decoding is batch-invariant here).
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        expected = {}
        for p in {i % len(PROMPTS) for i in completed}:
            r = await http.post("/v1/completions", json={"prompt": PROMPTS[p], "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
            assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS
            expected[p] = r.json()["choices"][0]["text"]
    for i, text in completed.items():
        assert text == expected[i % len(PROMPTS)], i
    await serves_normally(server.base_url)
    await wait_idle(server.runtime)
