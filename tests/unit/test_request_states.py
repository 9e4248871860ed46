"""The runner's per-request state (actors/runners/request_state.py): made by a plan's
NewRequest, dropped by its freed_request_ids, and kept in line with the positions the
scheduler plans (a token the core never applied is forgotten, its matcher rolled back)."""

from __future__ import annotations

import pytest

from actors.runners.request_state import RequestStates, UnknownRequest
from runtime.messages import PENDING_TOKEN, NewRequest, ScheduledSeq, StepPlan
from runtime.sampling import SamplingParams
from tests.support.fakes import CountingMatcher


def seq(rid: str, tokens: list[int], start: int) -> ScheduledSeq:
    return ScheduledSeq(request_id=rid, token_ids=tokens, start_pos=start, block_table=[0], sample=True, sampling=SamplingParams(), seed=0)


def test_new_requests_come_in_and_freed_ones_go() -> None:
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="a", prompt_token_ids=(1, 2)), NewRequest(request_id="b", prompt_token_ids=(3,)))))
    assert len(states) == 2 and states.get("a").history == [1, 2] and states.get("a").num_prompt_tokens == 2
    states.apply(StepPlan(step_id=1, seqs=(), freed_request_ids=("a", "gone-already")))
    assert "a" not in states and "b" in states
    with pytest.raises(UnknownRequest):
        states.get("a")


def test_a_freed_id_that_comes_back_starts_afresh() -> None:
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="a", prompt_token_ids=(1,)),)))
    states.get("a").history.append(9)
    states.apply(StepPlan(step_id=1, seqs=(), freed_request_ids=("a",), new_requests=(NewRequest(request_id="a", prompt_token_ids=(4, 5)),)))
    assert states.get("a").history == [4, 5]


def test_aligning_forgets_tokens_the_core_never_applied_and_rolls_the_matcher_back() -> None:
    matcher = CountingMatcher()
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="a", prompt_token_ids=(1, 2, 3), matcher=matcher),)))
    state = states.align("a", 3)
    for token in (7, 8):  # two sampled and accepted
        matcher.consume_token(token)
        state.history.append(token)
    # The request was preempted while the step that sampled 8 ran: the core knows 7 only, and
    # the recompute samples position 4 again.
    state = states.align("a", 4)
    assert state.history == [1, 2, 3, 7] and matcher.consumed == [7]
    assert states.align("a", 4).history == [1, 2, 3, 7]  # nothing more to forget


def test_a_pending_token_is_fed_from_the_history() -> None:
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="a", prompt_token_ids=(1, 2)),)))
    states.get("a").history.append(6)  # sampled by the step in flight when the next was planned
    assert states.input_ids(seq("a", [PENDING_TOKEN], 2)) == [6]
    assert states.input_ids(seq("a", [1, 2], 0)) == [1, 2]


def test_a_token_the_core_added_joins_the_history_and_a_draft_does_not() -> None:
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="a", prompt_token_ids=(1, 2)),)))
    states.get("a").history.append(6)  # sampled at position 2
    assert states.input_ids(seq("a", [6, 7, 8], 2)) == [6, 7, 8]  # 7 and 8: the core put them there
    assert states.get("a").history == [1, 2, 6, 7, 8]
    drafted = ScheduledSeq(request_id="a", token_ids=[8, 9, 9], start_pos=4, block_table=[0], sample=True, sampling=SamplingParams(), seed=0, num_draft_tokens=2)
    assert states.input_ids(drafted) == [8, 9, 9] and states.get("a").history == [1, 2, 6, 7, 8]


def test_the_history_array_follows_appends_and_rewinds() -> None:
    states = RequestStates()
    states.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id="a", prompt_token_ids=tuple(range(50))),)))
    state = states.get("a")
    assert state.history_array().tolist() == list(range(50))
    for token in range(100, 200):  # past the first buffer: it grows, keeping what it held
        state.history.append(token)
        if token % 7 == 0:
            assert state.history_array().tolist() == state.history
    state.rewind(30)  # a preempted request's tokens, cut back into the prompt
    state.history += [7, 8, 9]
    assert state.history_array().tolist() == [*range(30), 7, 8, 9]
    states.align("a", 31)
    assert state.history_array().tolist() == [*range(30), 7]
