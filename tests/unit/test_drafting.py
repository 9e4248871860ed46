"""Speculative decoding on the pure core: n-gram drafts (actors/drafting.py) and their verification.

A simulated device verifies a draft as the runners do: it samples each verify row as the
step-by-step loop would sample that position (here a pure function of request and position)
and keeps the draft while it matches. Every request must get exactly the tokens it gets with
drafting off, across EOS, max_tokens, preemption and an abort, in fewer steps when its text
repeats itself, and every block must come back.
"""

from __future__ import annotations

import random
from collections import defaultdict

from actors.drafting import Drafter, NgramIndex
from actors.sched_core import SchedulerConfig, SchedulerCore
from actors.step_cost import StepCostModel
from runtime.messages import StepPlan, StepResult, TokenizedRequest
from runtime.sampling import SamplingParams

EOS = 2


def cyclic_token(request_id: str, position: int) -> int:
    """Text that repeats with a period of 5 (what n-gram drafts catch); EOS for "e*" at 40."""
    if request_id.startswith("e") and position == 40:
        return EOS
    return 100 + (position % 5) * 3 + len(request_id)


def make_core(num_spec_tokens: int, num_blocks: int = 128) -> SchedulerCore:
    return SchedulerCore(SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, eos_token_ids=frozenset({EOS}), num_spec_tokens=num_spec_tokens))


def verify(plan: StepPlan) -> StepResult:
    sampled, accepted = {}, {}
    for s in plan.seqs:
        if not s.sample:
            continue
        base = len(s.token_ids) - s.num_draft_tokens
        position, kept = s.start_pos + base, 0
        token = cyclic_token(s.request_id, position)
        while kept < s.num_draft_tokens and token == s.token_ids[base + kept]:
            kept += 1
            token = cyclic_token(s.request_id, position + kept)
        sampled[s.request_id] = token
        if s.num_draft_tokens:
            accepted[s.request_id] = kept
    return StepResult(step_id=plan.step_id, sampled=sampled, accepted=accepted)


def run(core: SchedulerCore, requests: list[tuple[str, list[int], int]], abort_at: dict[int, str]) -> tuple[dict[str, list[int]], int]:
    for rid, prompt, max_tokens in requests:
        core.add(TokenizedRequest(request_id=rid, prompt_token_ids=prompt, sampling=SamplingParams(), max_tokens=max_tokens, seed=0, arrival_time=0.0))
    outputs: dict[str, list[int]] = defaultdict(list)
    steps = 0
    while core.has_work:
        if steps in abort_at:
            core.abort(abort_at[steps])
        plan = core.schedule()
        assert plan is not None
        steps += 1
        for delta in core.update(plan, verify(plan)):
            outputs[delta.request_id].extend(delta.token_ids)
    return dict(outputs), steps


def test_drafts_never_change_a_token_and_save_steps_on_repeating_text() -> None:
    rng = random.Random(5)
    requests = [(f"{'e' if i % 2 else 'r'}{i}", [rng.randrange(10, 60) for _ in range(rng.randrange(3, 20))], rng.randrange(8, 60)) for i in range(6)]
    plain, plain_steps = run(make_core(0), requests, {})
    core = make_core(4)
    drafted, steps = run(core, requests, {})
    assert drafted == plain
    assert steps < plain_steps * 0.6, (steps, plain_steps)
    stats = core.statistics()
    assert stats["spec_accepted_tokens"] > 0 and stats["kv_blocks_used"] == 0
    # A request that leaves mid-way gets the start of what it would have got.
    left, _ = run(make_core(4), requests, {5: "r0"})
    assert left["r0"] == plain["r0"][: len(left["r0"])] and {r: t for r, t in left.items() if r != "r0"} == {r: t for r, t in plain.items() if r != "r0"}


def test_under_block_pressure_drafts_give_way_and_tokens_stay_the_same() -> None:
    requests = [(f"r{i}", list(range(10, 22)), 40) for i in range(4)]
    plain, _ = run(make_core(0, num_blocks=24), requests, {})
    core = make_core(4, num_blocks=24)
    drafted, _ = run(core, requests, {})
    assert drafted == plain and core.num_preemptions > 0 and core.blocks.num_used_blocks == 0


def test_the_index_finds_the_latest_earlier_occurrence() -> None:
    index = NgramIndex()
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert index.propose(tokens, 3) == [7, 8, 1]  # after the latest earlier "1 2 3"
    tokens += [7, 8]
    assert index.propose(tokens, 2) == [1, 2]  # "3 7 8" seen once before: what followed it
    assert NgramIndex().propose([5, 6, 7], 4) == []


def test_drafting_turns_itself_off_where_a_token_costs_a_row() -> None:
    drafter = Drafter(max_tokens=4)
    cheap_tokens = StepCostModel(((1, 0, 0.050), (32, 0, 0.120), (0, 256, 0.200), (1, 256, 0.205), (32, 128, 0.190)))
    assert drafter.worth(cheap_tokens, 1, "a") > 0  # one stream: a verify token is nearly free
    dear_tokens = StepCostModel(((1, 0, 0.010), (32, 0, 0.320), (0, 256, 2.56), (1, 256, 2.57), (32, 128, 1.60)))
    assert drafter.worth(dear_tokens, 32, "a") == 0  # compute-bound: a token costs a row
    for _ in range(10):
        drafter.record("a", 4, 0)  # nothing ever accepted
    assert drafter.worth(cheap_tokens, 1, "a") == 0


def test_one_stream_drafts_though_a_prompt_step_has_a_fixed_cost() -> None:
    """A compiled CPU runner's fit (ops/results/sweep-c1-c4-c16-c32-default-spec-auto-llama-server-tfserve-2026-11-27-xeon-amx.json's
    server: a one-row decode 10.5 ms, a prompt step 31 ms more): one stream's verify step is the
    few-token graph, its tokens costing as rows, so it drafts; beside other rows a verify step
    is a mixed step and pays the fixed cost, so at 4 rows it does not."""
    fit = StepCostModel(((1, 0, 0.0113), (4, 0, 0.0137), (32, 0, 0.036), (1, 16, 0.0445), (0, 64, 0.062), (1, 128, 0.084), (32, 128, 0.110)))
    coef = fit.coefficients_ms()
    assert coef is not None and coef["prompt_step"] > 20  # the fixed cost the fit learnt
    assert fit.predict_verify(1, 4) < fit.predict(1, 4) - 0.015  # alone: rows, not a prompt chunk
    assert fit.predict_verify(4, 4) == fit.predict(4, 4)
    drafter = Drafter(max_tokens=4)
    assert drafter.worth(fit, 1, "a") > 0
    assert drafter.worth(fit, 4, "a") == 0


def test_a_step_is_not_planned_ahead_while_a_request_would_draft() -> None:
    """A draft starts from the token the step in flight samples: async scheduling waits for it."""
    for spec, ahead in ((4, False), (0, True)):
        core = make_core(spec)
        core.add(TokenizedRequest(request_id="r", prompt_token_ids=[10, 11, 12], sampling=SamplingParams(), max_tokens=20, seed=0, arrival_time=0.0))
        plan = core.schedule()
        assert plan is not None
        core.update(plan, verify(plan))
        decode = core.schedule()
        assert decode is not None and (core.schedule_ahead(decode) is not None) is ahead


def test_a_request_that_wont_draft_does_not_hold_back_planning_ahead() -> None:
    """Only a request that may draft makes async scheduling wait: one decoding under a grammar
    that thinks first (it never drafts) is planned ahead as with drafting off."""
    from runtime.sampling import Guide, Thinking

    core = make_core(4)
    thinking = Thinking(open=True, start_ids=(5,), end_ids=(6,))
    sampling = SamplingParams(guide=Guide(kind="json_object", param="response_format"), thinking=thinking)
    core.add(TokenizedRequest(request_id="r", prompt_token_ids=[10, 11, 12], sampling=sampling, max_tokens=20, seed=0, arrival_time=0.0))
    plan = core.schedule()
    assert plan is not None
    core.update(plan, verify(plan))
    decode = core.schedule()
    assert decode is not None and core.schedule_ahead(decode) is not None


def test_the_shared_pool_drafts_what_an_earlier_request_wrote() -> None:
    """A request with no repeat of its own drafts from a finished request's output; the pool
    keeps at most its capacity, the least recently used n-grams going first."""
    # "w" and "x" write the same text (the cyclic text of a one-letter id) after the same
    # prompt: on a core that served "w" first, "x" drafts from its first token on.
    core = make_core(4)
    first, _ = run(core, [("w", [70, 71, 72], 30)], {})
    assert core.drafter is not None and len(core.drafter.pool) > 0
    warm, warm_steps = run(core, [("x", [70, 71, 72], 30)], {})
    cold, cold_steps = run(make_core(4), [("x", [70, 71, 72], 30)], {})
    assert warm["x"] == cold["x"] == first["w"]
    assert warm_steps < cold_steps, (warm_steps, cold_steps)

    from actors.drafting import NgramPool

    pool = NgramPool(capacity=6, span=3)
    pool.add([1, 2, 3, 4, 5, 6, 7], first_output=3)
    assert len(pool) == 6 and pool.propose([9, 3, 4, 5], 2) == [6, 7]
    assert pool.propose([1, 2], 3) == []  # an n-gram of the prompt alone is never learnt
    pool.add([20, 21, 22, 23], first_output=1)
    assert len(pool) == 6 and pool.propose([3, 4, 5], 1) == [6]  # still there: used last
    pool.add([40, 41, 42, 43, 44], first_output=1, adapter="tenant-a")  # a LoRA adapter's requests draft from their own only
    assert pool.propose([41, 42], 1, "tenant-a") == [43] and pool.propose([41, 42], 1, "tenant-b") == pool.propose([41, 42], 1) == []


def test_auto_never_drafts_in_a_wide_step() -> None:
    """`auto` caps the rows of a drafting step (AUTO_MAX_ROWS): wider steps neither draft nor
    hold back planning ahead, whatever the fit promises; narrower ones draft as the fit says."""
    from actors.drafting import AUTO_MAX_ROWS

    cheap_tokens = StepCostModel(((1, 0, 0.050), (32, 0, 0.120), (0, 256, 0.200), (1, 256, 0.205), (32, 128, 0.190)))
    capped = Drafter(max_tokens=4, max_rows=AUTO_MAX_ROWS)
    assert capped.worth(cheap_tokens, AUTO_MAX_ROWS, "a") > 0 and capped.worth(cheap_tokens, AUTO_MAX_ROWS + 1, "a") == 0
    assert Drafter(max_tokens=4).worth(cheap_tokens, AUTO_MAX_ROWS + 1, "a") > 0  # ngram: the fit alone

    core = SchedulerCore(SchedulerConfig(num_blocks=256, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, eos_token_ids=frozenset({EOS}), num_spec_tokens=4, spec_max_rows=2))
    for i in range(3):
        core.add(TokenizedRequest(request_id=f"r{i}", prompt_token_ids=[10 + i, 11, 12], sampling=SamplingParams(), max_tokens=20, seed=0, arrival_time=0.0))
    plan = core.schedule()
    assert plan is not None
    core.update(plan, verify(plan))
    decode = core.schedule()
    assert decode is not None and not any(s.num_draft_tokens for s in decode.seqs) and core.schedule_ahead(decode) is not None


def test_a_step_that_verified_drafts_is_not_learnt_by_the_step_cost_fit() -> None:
    """Verify rows are neither decode rows nor prompt tokens: learnt as prompt tokens, a few slow
    verify steps would shrink the prompt allowance of the steps after them."""
    from actors.model_drafts import observe_step
    from runtime.messages import ScheduledSeq

    seeded = ((1, 0, 0.010), (32, 0, 0.120), (0, 256, 0.200), (1, 256, 0.205), (32, 128, 0.190))
    fit = StepCostModel(seeded)
    before = fit.predict(1, 128)
    verify_row = ScheduledSeq(request_id="a", token_ids=[1, 2, 3, 4, 5], start_pos=40, block_table=[0], sample=True, sampling=SamplingParams(), seed=0, num_draft_tokens=4)
    for _ in range(10):
        observe_step(fit, None, StepPlan(step_id=0, seqs=(verify_row,)), StepResult(step_id=0, sampled={}), 0.5)
    assert fit.predict(1, 128) == before
    prompt_chunk = ScheduledSeq(request_id="b", token_ids=[1, 2, 3, 4, 5], start_pos=40, block_table=[0], sample=True, sampling=SamplingParams(), seed=0)
    for _ in range(10):
        observe_step(fit, None, StepPlan(step_id=0, seqs=(prompt_chunk,)), StepResult(step_id=0, sampled={}), 0.5)
    assert fit.predict(1, 128) != before  # the same step without a draft is learnt
