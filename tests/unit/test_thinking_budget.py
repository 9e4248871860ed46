"""A thinking budget in the scheduler core, and the runner's grammar that waits for the end of
thinking: the core writes the end-of-thinking sequence after the budget-th thinking
token, the next step feeds it, and the runner's history and matcher follow the core. With
logprobs, the forced tokens wait for the step that feeds them, whose rows score them."""

from __future__ import annotations

import pytest
import torch

from actors.lookahead import plan_ahead
from actors.runners.logit_rows import LogitRows
from actors.runners.request_state import RequestStates
from runtime.messages import Logprob, NewRequest, ScheduledSeq, StepPlan, StepResult
from runtime.sampling import SamplingParams, Thinking
from tests.support.fakes import CountingMatcher
from tests.support.sched_driver import Driver, make_core, prompt_of

END = (7, 8)  # "\n", "</think>"
BUDGETED = Thinking(open=True, end_ids=(8,), budget=3, forced_end=END)


def test_the_core_forces_the_end_of_thinking_at_the_budget() -> None:
    driver = Driver(make_core(), token=lambda rid, pos: 5)
    driver.add("r", prompt_of(6), max_tokens=10, thinking=BUDGETED)
    driver.run()
    out = driver.outputs["r"]
    assert out[:5] == [5, 5, 5, 7, 8]  # three thinking tokens, then the forced end
    assert len(out) == 10 and driver.finished["r"].finish_reason.value == "length"
    fed = [s for p in driver.plans for s in p.seqs if s.request_id == "r" and len(s.token_ids) > 1 and s.start_pos >= 6]
    assert fed and fed[0].token_ids == [5, 7, 8]  # the step after feeds the forced tokens like any


def test_the_budget_counts_within_max_tokens() -> None:
    driver = Driver(make_core(), token=lambda rid, pos: 5)
    driver.add("r", prompt_of(6), max_tokens=4, thinking=BUDGETED)
    driver.run()
    assert driver.outputs["r"] == [5, 5, 5, 7] and driver.finished["r"].finish_reason.value == "length"


def test_no_step_is_planned_ahead_over_a_budget_that_may_end() -> None:
    core = make_core()
    driver = Driver(core, token=lambda rid, pos: 5)
    driver.add("r", prompt_of(4), max_tokens=20, thinking=Thinking(open=True, end_ids=(8,), budget=2, forced_end=END))
    plan, _ = driver.step()  # the prompt, and the first thinking token
    assert plan is not None
    nxt = driver.schedule()
    assert nxt is not None and plan_ahead(core, nxt) is None  # its token in flight may be the budget's last


def test_the_grammar_starts_where_thinking_ends_and_follows_rewinds() -> None:
    states = RequestStates()
    matcher = CountingMatcher()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="r", prompt_token_ids=(1, 2), matcher=matcher),)))
    spec = Thinking(open=True, end_ids=(8,))
    state = states.get("r")
    for token in (5, 5):
        assert state.live_matcher(spec) is None
        state.history.append(token)  # sampled while thinking: the grammar does not see it
    state.history.append(8)
    assert state.live_matcher(spec) is matcher and state.grammar_from == 5
    matcher.consume_token(3)
    state.history.append(3)
    states.align("r", 4)  # back before the end of thinking: the grammar forgets what it read
    assert matcher.consumed == [] and state.grammar_from is None and state.live_matcher(spec) is None
    row = ScheduledSeq(request_id="r", token_ids=[5, 7, 8], start_pos=3, block_table=[0], sample=True, sampling=SamplingParams(thinking=spec), seed=0)
    assert states.input_ids(row) == [5, 7, 8] and state.history == [1, 2, 5, 5, 7, 8]  # the core's forced tokens replace its own
    assert state.live_matcher(spec) is matcher and state.grammar_from == 6


def test_forced_tokens_fed_in_chunks_join_the_history() -> None:
    """A small step budget feeds the forced end in pieces, the first without sampling: each
    piece joins the runner's history, so the next pending token is found there."""
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="r", prompt_token_ids=(1, 2), matcher=None),)))
    state = states.get("r")
    state.history.append(5)  # sampled at position 2; the core then wrote 7, 8 after it
    spec = SamplingParams(thinking=Thinking(open=True, end_ids=(8,)))
    states.input_ids(ScheduledSeq(request_id="r", token_ids=[5, 7], start_pos=2, block_table=[0], sample=False, sampling=spec, seed=0))
    assert states.input_ids(ScheduledSeq(request_id="r", token_ids=[8], start_pos=4, block_table=[0], sample=True, sampling=spec, seed=0)) == [8]
    assert state.history == [1, 2, 5, 7, 8]


# -- the forced tokens' logprobs ------------------------------------------------------------------

LONG_END = (7, 8, 7, 7)  # "\n", "</think>", "\n", "\n"


class ScoringDriver(Driver):
    """A Driver whose runner reports logprobs as the torch runner orders them (the forced
    tokens' from the rows before them, then the sampled token's), each entry's value minus
    the position it scores: an entry in the wrong place shows."""

    def result(self, plan: StepPlan, overrides: dict[str, int] | None = None) -> StepResult:
        base = super().result(plan, overrides)
        logprobs: dict[str, list[Logprob]] = {}
        for s in plan.seqs:
            for j, token in enumerate(s.forced_ids):
                assert s.start_pos <= s.forced_pos + j - 1 < s.start_pos + len(s.token_ids)  # its row is fed here
                logprobs.setdefault(s.request_id, []).append(Logprob(token_id=token, logprob=-float(s.forced_pos + j)))
            if s.sample:
                position = s.start_pos + len(s.token_ids)
                logprobs.setdefault(s.request_id, []).append(Logprob(token_id=base.sampled[s.request_id], logprob=-float(position)))
        return StepResult(step_id=plan.step_id, sampled=base.sampled, logprobs=logprobs)


def scored_run(max_tokens: int, preempt_at: int | None = None, **core: int) -> tuple[ScoringDriver, list[Logprob]]:
    driver = ScoringDriver(make_core(**core), token=lambda rid, pos: 5)
    driver.add("r", prompt_of(6), max_tokens=max_tokens, logprobs=0, thinking=Thinking(open=True, end_ids=(8,), budget=3, forced_end=LONG_END))
    for step in range(200):
        if not driver.core.has_work:
            break
        if step == preempt_at:
            seq = driver.core.requests["r"]
            assert seq.held is not None and len(seq.held.logprobs) < len(LONG_END)  # some forced tokens still wait for their entries
            driver.core._preempt(seq)
        driver.step()
    entries = [e for d in driver.deltas for e in d.logprobs or ()]
    for d in driver.deltas:
        assert len(d.logprobs or ()) == len(d.token_ids), d  # every token goes out with its entry
    return driver, entries


@pytest.mark.parametrize("core", [{}, {"max_num_batched_tokens": 2}], ids=["whole", "in-chunks"])
def test_forced_tokens_go_out_with_the_logprobs_of_the_rows_before_them(core: dict[str, int]) -> None:
    driver, entries = scored_run(12, **core)
    out = driver.outputs["r"]
    assert out[:8] == [5, 5, 5, *LONG_END, 5] and len(out) == 12
    assert [e.token_id for e in entries] == out
    assert [e.logprob for e in entries] == [-float(6 + i) for i in range(12)]  # each from its own position
    carried = [d.token_ids for d in driver.deltas if d.request_id == "r"]
    assert carried[2] == [5] and carried[3] == [*LONG_END, 5]  # held until the step that fed and scored them


@pytest.mark.parametrize(("core", "preempt_at"), [({}, 3), ({"max_num_batched_tokens": 2}, 6)], ids=["before-feeding", "half-scored"])
def test_forced_tokens_are_scored_once_after_a_preemption(core: dict[str, int], preempt_at: int) -> None:
    """Preempted before the step that feeds the forced tokens, or after a chunk that scored
    some of them: the recompute scores each missing one, and none twice."""
    driver, entries = scored_run(12, preempt_at=preempt_at, **core)
    assert driver.outputs["r"][:8] == [5, 5, 5, *LONG_END, 5] and driver.core.num_preemptions == 1
    assert [e.logprob for e in entries] == [-float(6 + i) for i in range(12)]


def test_max_tokens_inside_the_forced_end_costs_one_step_to_score_them() -> None:
    driver, entries = scored_run(5)  # three thoughts, then room for two forced tokens
    assert driver.outputs["r"] == [5, 5, 5, 7, 8] and driver.finished["r"].finish_reason.value == "length"
    assert [(e.token_id, e.logprob) for e in entries] == [(t, -float(6 + i)) for i, t in enumerate([5, 5, 5, 7, 8])]
    last = driver.plans[-1].seqs[0]
    assert last.token_ids == [5, 7, 8] and last.forced_ids == (7, 8)  # fed to score them; its sampled token is dropped
    assert not driver.core.has_work


def test_without_logprobs_the_forced_tokens_go_out_at_once() -> None:
    driver = Driver(make_core(), token=lambda rid, pos: 5)
    driver.add("r", prompt_of(6), max_tokens=10, thinking=Thinking(open=True, end_ids=(8,), budget=3, forced_end=LONG_END))
    driver.run()
    assert [d.token_ids for d in driver.deltas][2] == [5, *LONG_END]
    assert not any(s.forced_ids for p in driver.plans for s in p.seqs)


def test_the_runner_scores_forced_tokens_from_the_rows_before_them() -> None:
    """LogitRows keeps the row before each forced token (beside prompt logprob rows or before
    the sampling row) and reports its log-probability there, with the top entries."""
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(
        NewRequest(request_id="a", prompt_token_ids=(1, 2, 3)), NewRequest(request_id="b", prompt_token_ids=(1, 2)),
    )))  # fmt: skip
    states.get("a").history.append(4)
    a = ScheduledSeq(request_id="a", token_ids=[3, 4, 7, 8], start_pos=2, block_table=[0, 1], sample=True,
                     sampling=SamplingParams(logprobs=2), seed=0, num_prompt_tokens=3, forced_ids=(7, 8), forced_pos=4)  # fmt: skip
    # recomputed from the start with prompt logprobs: the forced token's row is among the prompt rows
    b = ScheduledSeq(request_id="b", token_ids=[1, 2, 5, 7], start_pos=0, block_table=[2], sample=False,
                     sampling=SamplingParams(logprobs=1, prompt_logprobs=0), seed=0, num_prompt_tokens=2, forced_ids=(7,), forced_pos=3)  # fmt: skip
    rows = LogitRows.plan((a, b), states)
    assert rows.index == [1, 2, 3, 4, 5, 6, 7] and rows.forced_rows == {0: [0, 1], 1: [5]}
    logits = torch.randn(len(rows.index), 12)
    logprobs = torch.log_softmax(logits[rows.logprob_rows()], dim=-1)
    out = rows.collect_logprobs((a, b), states, logprobs, {"a": 9})
    full = torch.log_softmax(logits, dim=-1)
    assert [e.token_id for e in out["a"]] == [7, 8, 9]
    for entry, row in zip(out["a"], (0, 1, 2)):
        assert entry.logprob == pytest.approx(float(full[row, entry.token_id]))
        assert [t for t, _ in entry.top] == full[row].topk(2).indices.tolist()
    assert [e.token_id for e in out["b"]] == [2, 7]  # the prompt token's entry, then the forced one's
    assert out["b"][1].logprob == pytest.approx(float(full[5, 7])) and len(out["b"][1].top) == 1
