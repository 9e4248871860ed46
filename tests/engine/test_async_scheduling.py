"""Async scheduling (--async-scheduling) on the tiny model: the same tokens as the serial loop.

Seeded sampling, penalties (they read the runner's token history) and a JSON-constrained
request (its matcher lives on the device thread) run concurrently, staggered so they join a
running batch, with the engine planning each decode step while the one before it runs. Each
request's tokens must equal the serial loop's, steps must have been planned ahead, and every
KV block and every state the runner keeps must be gone at the end.
"""

from __future__ import annotations

from pathlib import Path

import trio

from actors.build import build_engine
from runtime.request import Prompt
from runtime.sampling import Guide, SamplingParams
from tests.support.servers import tiny_config

REQUESTS = [
    ([5, 6, 7, 8, 9, 10, 11], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)),
    ([12, 13, 14], SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=30, ignore_eos=True)),
    ([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32], SamplingParams(temperature=0.8, seed=12, frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.2, max_tokens=28, ignore_eos=True)),
    ([40, 41], SamplingParams(temperature=0.7, seed=13, max_tokens=20, guide=Guide(kind="json_object", param="response_format"))),
    ([50, 51, 52, 53], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)),
]


async def run(model_dir: Path, async_scheduling: bool) -> tuple[list[list[int]], dict, int]:
    # Drafting off: a step that drafts is not planned ahead (a draft starts from the token in
    # flight), and `auto`, the default, drafts at every step of so few streams.
    engine = build_engine(tiny_config(model_dir, async_scheduling=async_scheduling, spec_decoding="off"))
    tokens: list[list[int]] = [[] for _ in REQUESTS]

    async def one(i: int) -> None:
        await trio.sleep(0.01 * i)
        prompt, sampling = REQUESTS[i]
        async with engine.submit(Prompt(token_ids=prompt), sampling) as stream:
            async for delta in stream:
                tokens[i] += delta.token_ids

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with trio.open_nursery() as clients:
            for i in range(len(REQUESTS)):
                clients.start_soon(one, i)
        # One more request: its plan frees the others' runner state.
        async with engine.submit(Prompt(token_ids=[9, 9]), SamplingParams(max_tokens=2, ignore_eos=True)) as stream:
            assert sum([len(d.token_ids) async for d in stream]) == 2
        stats = engine.statistics()
        kept = len(engine.runner.requests)  # type: ignore[attr-defined]
        nursery.cancel_scope.cancel()
    return tokens, stats, kept


async def test_async_scheduling_gives_the_serial_tokens(tiny_model_dir: Path) -> None:
    serial, _, _ = await run(tiny_model_dir, async_scheduling=False)
    overlapped, stats, kept = await run(tiny_model_dir, async_scheduling=True)
    assert overlapped == serial and all(serial)
    assert stats["steps_ahead"] > 0
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0
    assert kept <= 1  # only the last request's state is left, until a next plan frees it
