"""Timed start-up steps that seed the scheduler's step cost model (actors/step_cost.py).

Owns: the few plans of different sizes a runner runs once after its warm-up, and their timing.

Why: the scheduler sizes prompt chunks by what a step costs on this machine. Without these
samples its fit knows nothing until a few real steps of each kind have run, and the steps it
would then size by the fixed token budget alone are the first burst under load, exactly the
steps that stall streams. Five steps (one decode row, 32 rows, a long prompt alone, beside a
decode, and half of it beside 32 decodes) pin down the fit's three costs; they take about a
second on a 2-core CPU. All rows share the same first blocks: what they write there is
garbage, which the runner zeroes after.
Imports runtime only: the runner hands in its own `execute`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.messages import NewRequest, ScheduledSeq, StepPlan
from runtime.sampling import SamplingParams

ROWS = 32
PROMPT_TOKENS = 256
CONTEXT = 64  # tokens each decode row attends to

Sample = tuple[int, int, float]  # (decode rows, prompt tokens, seconds)


def plans(block_size: int, num_blocks: int, max_model_len: int) -> tuple[list[tuple[int, int, StepPlan]], int]:
    """The timed plans, each with its (decode rows, prompt tokens), and the KV slots they write."""
    limit = min(num_blocks * block_size, max_model_len)
    prompt = max(2, min(PROMPT_TOKENS, limit // 2))
    context = max(1, min(CONTEXT, limit // 2 - 1))
    greedy = SamplingParams(temperature=0.0, max_tokens=1)

    def table(tokens: int) -> list[int]:
        return list(range(-(-tokens // block_size)))

    def decode(i: int) -> ScheduledSeq:
        return ScheduledSeq(request_id=f"cal-d{i}", token_ids=[1], start_pos=context, block_table=table(context + 1), sample=True, sampling=greedy, seed=i)

    def chunk(tokens: int) -> ScheduledSeq:
        return ScheduledSeq(request_id="cal-p", token_ids=[1] * tokens, start_pos=0, block_table=table(tokens), sample=True, sampling=greedy, seed=0)

    def plan(step_id: int, seqs: list[ScheduledSeq]) -> StepPlan:
        # Every row is new to the runner in every plan: its state starts afresh each run.
        new = tuple(NewRequest(request_id=s.request_id, prompt_token_ids=(1,) * (s.start_pos + len(s.token_ids))) for s in seqs)
        return StepPlan(step_id=step_id, seqs=tuple(seqs), new_requests=new)

    shapes = [
        (1, 0, [decode(0)]),
        (ROWS, 0, [decode(i) for i in range(ROWS)]),
        (0, prompt, [chunk(prompt)]),
        (1, prompt, [decode(0), chunk(prompt)]),
        (ROWS, prompt // 2, [*(decode(i) for i in range(ROWS)), chunk(prompt // 2)]),
    ]
    out = [(rows, tokens, plan(-2 - i, seqs)) for i, (rows, tokens, seqs) in enumerate(shapes)]
    return out, max(prompt, context + 1)


def time_steps(execute: Callable[[StepPlan], object], timed: list[tuple[int, int, StepPlan]]) -> list[Sample]:
    """Run the largest plan, the prompt alone and the decode-only ones once untimed (first-touch
    costs; on a GPU a decode-only step's first run captures its bucket's CUDA graph, and the
    first prompt alone took 71 ms against 28 ms beside a decode: ops/results/gpu-check-first-run-2026-11-26-h100.json),
    then each plan once, timed."""
    for _, _, plan in [timed[-1], *(t for t in timed if t[0] == 0 or t[1] == 0)]:
        execute(plan)
    samples = []
    for rows, tokens, plan in timed:
        started = time.perf_counter()
        execute(plan)
        samples.append((rows, tokens, time.perf_counter() - started))
    return samples
