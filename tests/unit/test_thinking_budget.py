"""A thinking budget in the scheduler core, and the runner's grammar that waits for the end of
thinking (issue 20): the core writes the end-of-thinking sequence after the budget-th thinking
token, the next step feeds it, and the runner's history and matcher follow the core."""

from __future__ import annotations

from actors.lookahead import plan_ahead
from actors.runners.request_state import RequestStates
from runtime.messages import NewRequest, ScheduledSeq, StepPlan
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
