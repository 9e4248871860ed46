"""Speculative decoding's test helpers: an engine to send requests to, and drafts on every step.

`running` starts an engine in the test's trio loop and cancels it on leaving; `generate` is one
request's deltas. `always_draft` makes the drafter propose its full `num_spec_tokens` whenever
a draft is found: how much to draft otherwise comes from the step cost fit, measured on this
machine's steps (actors/drafting.py `Drafter.worth`), so on a busy 2-core machine a test's
requests would draft in one run and not in the next. The output must not change either way.
`DraftSwitch` turns drafting on and off between one engine's requests (a model too large to
load twice for a test).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from actors.build import build_engine
from actors.drafting import Drafter
from runtime.config import RuntimeConfig
from runtime.messages import TextDelta
from runtime.request import Prompt
from runtime.sampling import SamplingParams


class DraftSwitch:
    """While `on`, every request drafts all it can; while off, none does (the same as drafting off)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, on: bool = True) -> None:
        self.on = on
        monkeypatch.setattr(Drafter, "worth", lambda drafter, cost, rows, request_id: drafter.max_tokens if self.on else 0)


def always_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    DraftSwitch(monkeypatch, on=True)


@asynccontextmanager
async def running(config: RuntimeConfig) -> AsyncIterator[Any]:
    engine = build_engine(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        try:
            yield engine
        finally:
            nursery.cancel_scope.cancel()


async def generate(engine: Any, prompt: list[int], sampling: SamplingParams, stagger: float = 0.0) -> list[TextDelta]:
    await trio.sleep(stagger)
    async with engine.submit(Prompt(token_ids=prompt), sampling) as stream:
        return [delta async for delta in stream]


def tokens(deltas: list[TextDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


async def leave_mid_draft(config: RuntimeConfig, prompt_for: Any, leave_after: list[int]) -> tuple[list[int], dict[str, Any], int, int]:
    """Clients that leave after `leave_after[i]` tokens of `prompt_for(i)` (greedy, 60 at most),
    staggered, then one more request whose plan frees the rest: (tokens each got, the engine's
    statistics, the runner's states left, draft tokens before the clients came)."""
    received: list[int] = []
    async with running(config) as engine:

        async def leaver(i: int, count: int) -> None:
            await trio.sleep(0.005 * i)
            got = 0
            async with engine.submit(Prompt(token_ids=prompt_for(i)), SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)) as stream:
                async for delta in stream:
                    got += len(delta.token_ids)
                    if got >= count:
                        break  # the client leaves: the engine aborts the request
            received.append(got)

        drafted_before = engine.statistics()["spec_draft_tokens"]
        async with trio.open_nursery() as clients:
            for i, count in enumerate(leave_after):
                clients.start_soon(leaver, i, count)
        assert len(tokens(await generate(engine, [9, 9], SamplingParams(max_tokens=2, ignore_eos=True)))) == 2
        return received, engine.statistics(), len(engine.runner.requests), drafted_before
