"""Drafts from a draft model on the pure core (actors/model_drafts.py): the plan's placeholders,
the runner's tokens kept, and what a draft model's own forwards cost.

A simulated device drafts as a runner with a draft model does: it fills each row's DRAFT_TOKEN
placeholders with a "draft model" (a pure function of request and position that is sometimes
wrong), samples each verify row as the step-by-step loop would, and keeps the draft while it
matches. Every request must get exactly the tokens it gets with drafting off, with the blocks
reserved for the placeholders and every block back at the end.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from actors.model_drafts import ModelDrafter
from actors.sched_core import SchedulerConfig, SchedulerCore
from actors.step_cost import StepCostModel
from runtime.messages import DRAFT_TOKEN, StepPlan, StepResult, TokenizedRequest
from runtime.sampling import SamplingParams


def true_token(request_id: str, position: int) -> int:
    return 100 + (position * 7 + len(request_id)) % 50


def draft_token(request_id: str, position: int) -> int:
    """Right two times in three."""
    return true_token(request_id, position) if position % 3 else 99


def make_core(num_spec_tokens: int, num_blocks: int = 128) -> SchedulerCore:
    config = SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, num_spec_tokens=num_spec_tokens, draft_model=True)
    return SchedulerCore(config)


def device(plan: StepPlan) -> StepResult:
    sampled, accepted, drafted = {}, {}, {}
    for s in plan.seqs:
        if not s.sample:
            continue
        base = len(s.token_ids) - s.num_draft_tokens
        position = s.start_pos + base
        assert s.token_ids[base:] == [DRAFT_TOKEN] * s.num_draft_tokens  # the core never drafts a token itself
        draft = [draft_token(s.request_id, position + j) for j in range(s.num_draft_tokens)]
        kept = 0
        while kept < len(draft) and draft[kept] == true_token(s.request_id, position + kept):
            kept += 1
        sampled[s.request_id] = true_token(s.request_id, position + kept)
        if draft:
            accepted[s.request_id], drafted[s.request_id] = kept, draft
    return StepResult(step_id=plan.step_id, sampled=sampled, accepted=accepted, drafted=drafted, draft_seconds=0.001, draft_forwards=2)


def run(core: SchedulerCore, requests: list[tuple[str, list[int], int]]) -> dict[str, list[int]]:
    for rid, prompt, max_tokens in requests:
        core.add(TokenizedRequest(request_id=rid, prompt_token_ids=prompt, sampling=SamplingParams(), max_tokens=max_tokens, seed=0, arrival_time=0.0))
    outputs: dict[str, list[int]] = defaultdict(list)
    while core.has_work:
        plan = core.schedule()
        assert plan is not None
        for s in plan.seqs:  # the draft's positions have their blocks
            assert len(s.block_table) * 4 >= s.start_pos + len(s.token_ids)
        for delta in core.update(plan, device(plan)):
            outputs[delta.request_id].extend(delta.token_ids)
    return dict(outputs)


def test_the_runner_fills_the_slots_and_the_core_keeps_what_it_accepted() -> None:
    rng = random.Random(3)
    requests = [(f"r{i}", [rng.randrange(10, 60) for _ in range(rng.randrange(3, 14))], rng.randrange(8, 40)) for i in range(5)]
    plain = run(make_core(0), requests)
    core = make_core(4)
    assert isinstance(core.drafter, ModelDrafter)
    assert run(core, requests) == plain
    stats = core.statistics()
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"] and stats["kv_blocks_used"] == 0
    assert core.drafter.forward_seconds == pytest.approx(0.0005)  # each step's draft decodes, per forward


def test_a_tight_cache_still_gives_the_same_tokens() -> None:
    requests = [(f"r{i}", list(range(10, 22)), 30) for i in range(4)]
    plain = run(make_core(0, num_blocks=20), requests)
    core = make_core(4, num_blocks=20)
    assert run(core, requests) == plain and core.num_preemptions > 0 and core.blocks.num_used_blocks == 0


def test_the_fit_learns_the_step_without_the_draft_decodes() -> None:
    """A step's draft decodes are the drafter's to learn; the fit sees the step without them."""
    core = make_core(4)
    core.add(TokenizedRequest(request_id="r", prompt_token_ids=[10, 11, 12], sampling=SamplingParams(), max_tokens=20, seed=0, arrival_time=0.0))
    seen: list[float] = []
    core.step_cost.observe = lambda rows, tokens, seconds: seen.append(seconds)  # type: ignore[method-assign]
    plan = core.schedule()
    assert plan is not None
    core.update(plan, StepResult(step_id=plan.step_id, sampled={"r": 5}, draft_seconds=0.25, draft_forwards=1), started=1.0, finished=2.0)
    assert seen == [0.75] and core.drafter is not None and core.drafter.forward_seconds == 0.25  # type: ignore[attr-defined]


def test_the_draft_models_own_forwards_are_paid_for() -> None:
    """The same step cost fit and acceptance: drafting pays while a draft forward is cheap beside
    a step, and not once it costs as much as the tokens it may add."""
    fit = StepCostModel(((1, 0, 0.050), (32, 0, 0.120), (0, 256, 0.200), (1, 256, 0.205), (32, 128, 0.190)))
    drafter = ModelDrafter(max_tokens=4)
    assert drafter.worth(fit, 1, "a") > 0  # no forward timed yet: draft, and let it be measured
    drafter.observe(forwards=3, seconds=0.003)
    assert drafter.worth(fit, 1, "a") > 0
    dear = ModelDrafter(max_tokens=4)
    dear.observe(forwards=1, seconds=0.2)  # a draft forward as dear as four steps
    assert dear.worth(fit, 1, "a") == 0
    assert dear.worth(fit, 1, "a") < drafter.worth(fit, 1, "a")
