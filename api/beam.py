"""Beam search for /v1/completions (`use_beam_search`, seed 004), on top of the engine.

Owns: the beam bookkeeping. Each round asks the engine, for every live beam, for the top 2k
next-token log-probabilities (a one-token request on prompt + beam); the prefix cache serves
every full block the beams share, so a round recomputes at most one block per beam. The 2k
best extensions by cumulative logprob become the next beams (those ending in EOS are set
aside as finished), as transformers' beam search does; at the end finished and live beams
are ranked by cumulative logprob / length ** length_penalty. Deterministic: no sampling.
This is vLLM's design for beam search in a continuous-batching engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from runtime.engine import Runtime
from runtime.messages import FinishReason, Logprob
from runtime.request import Prompt
from runtime.sampling import SamplingParams


@dataclass(slots=True)
class Beam:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[Logprob] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finished: bool = False

    def score(self, length_penalty: float) -> float:
        return self.cumulative_logprob / (max(1, len(self.tokens)) ** length_penalty)

    @property
    def finish_reason(self) -> FinishReason:
        return FinishReason.STOP if self.finished else FinishReason.LENGTH


async def beam_search(
    runtime: Runtime,
    prompt_ids: list[int],
    width: int,
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    length_penalty: float = 1.0,
) -> list[Beam]:
    """The `width` best beams, best first."""
    live = [Beam()]
    done: list[Beam] = []
    step_params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=2 * width)
    for _ in range(max_tokens):
        tops = await _next_token_logprobs(runtime, [prompt_ids + b.tokens for b in live], step_params)
        candidates: list[tuple[float, int, int, Logprob]] = []
        for b, entry in enumerate(tops):
            for token, lp in entry.top:
                candidates.append((live[b].cumulative_logprob + lp, b, token, entry))
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))  # deterministic tie-break
        next_live: list[Beam] = []
        for cumulative, b, token, entry in candidates[: 2 * width]:
            parent = live[b]
            chosen = Logprob(token_id=token, logprob=cumulative - parent.cumulative_logprob, top=entry.top)
            beam = Beam(parent.tokens + [token], parent.logprobs + [chosen], cumulative)
            if not ignore_eos and token in runtime.eos_token_ids:
                beam.finished = True
                done.append(beam)
            elif len(next_live) < width:
                next_live.append(beam)
        live = next_live
        if not live:
            break
    ranked = sorted(done + live, key=lambda beam: beam.score(length_penalty), reverse=True)
    return ranked[:width]


async def _next_token_logprobs(runtime: Runtime, prompts: list[list[int]], params: SamplingParams) -> list[Logprob]:
    out: list[Logprob | None] = [None] * len(prompts)

    async def one(i: int) -> None:
        async with runtime.submit(Prompt(token_ids=prompts[i]), params) as stream:
            async for delta in stream:
                if delta.logprobs:
                    out[i] = delta.logprobs[0]

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    assert all(entry is not None for entry in out), "a beam step returned no logprobs"
    return out  # type: ignore[return-value]
