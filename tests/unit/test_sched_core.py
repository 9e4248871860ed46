"""SchedulerCore driven by hand: schedule() -> StepPlan, update(plan, StepResult) -> TokenDeltas.

In the style of vLLM's test_scheduler.py. A `Driver` (tests/support/sched_driver.py) plays the
executor: it samples a token for every seq whose `sample` is set (a pure function of request id
and position, so a request's text does not depend on batching or preemption) and checks every
plan against what it knows of each request (prompt + outputs so far): the tokens fed are
exactly the next ones, blocks being written are private, the budget and the seat limit hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import msgspec
import pytest

from runtime.messages import FinishReason, Logprob, StepResult
from tests.support.sched_driver import EOS, Driver, assert_drained, default_token, item, make_core, plan_ids, prompt_of

# -- basics ----------------------------------------------------------------------------------------


def test_single_request_prefill_then_decode_to_length() -> None:
    core = make_core()
    d = Driver(core)
    d.add("a", prompt_of(6), max_tokens=3)
    assert core.statistics()["waiting"] == 1

    plan, deltas = d.step()
    (s,) = plan.seqs
    assert (s.start_pos, s.token_ids, s.sample) == (0, prompt_of(6), True)
    assert len(s.block_table) == 2
    assert [(x.request_id, x.token_ids, x.finish_reason, x.batch_size) for x in deltas] == [
        ("a", [default_token("a", 6)], None, 1)
    ]

    plan, deltas = d.step()
    (s,) = plan.seqs
    assert (s.start_pos, s.token_ids) == (6, [default_token("a", 6)])
    assert plan.step_id == 1

    plan, deltas = d.step()
    assert deltas[0].finish_reason is FinishReason.LENGTH
    assert d.outputs["a"] == [default_token("a", p) for p in (6, 7, 8)]
    assert_drained(core)
    assert core.statistics()["prefill_tokens"] == 6


def test_schedule_with_nothing_to_do_returns_none() -> None:
    core = make_core()
    assert core.schedule() is None
    assert core.abort("nope") is False


# -- admission --------------------------------------------------------------------------------------


def test_admission_up_to_max_num_seqs_fcfs() -> None:
    core = make_core(max_num_seqs=2)
    d = Driver(core)
    d.add("r0", prompt_of(4), max_tokens=2)
    d.add("r1", prompt_of(4), max_tokens=5)
    d.add("r2", prompt_of(4), max_tokens=2)
    d.add("r3", prompt_of(4), max_tokens=2)

    plan, _ = d.step()
    assert plan_ids(plan) == ["r0", "r1"]
    assert core.statistics()["waiting"] == 2
    plan, _ = d.step()  # r0 finishes in this step
    assert plan_ids(plan) == ["r0", "r1"]
    assert "r0" in d.finished
    plan, _ = d.step()
    assert plan_ids(plan) == ["r1", "r2"]  # r2 takes r0's seat, not r3
    assert item(plan, "r2").start_pos == 0  # a 4-token prompt has no full block to reuse
    for plan in d.plans:
        assert len(plan.seqs) <= 2
    d.run()
    assert set(d.finished) == {"r0", "r1", "r2", "r3"}
    assert_drained(core)


def test_admission_stops_at_token_budget_and_chunks_the_last_prompt() -> None:
    core = make_core(max_num_batched_tokens=10)
    d = Driver(core)
    for rid in ("r0", "r1", "r2"):
        d.add(rid, prompt_of(4, start=10 + 10 * int(rid[1])), max_tokens=2)

    plan, deltas = d.step()
    assert plan_ids(plan) == ["r0", "r1", "r2"]
    assert [len(s.token_ids) for s in plan.seqs] == [4, 4, 2]
    assert [s.sample for s in plan.seqs] == [True, True, False]
    assert plan.num_tokens == 10
    assert [x.request_id for x in deltas] == ["r0", "r1"]  # r2 sampled nothing yet

    plan, _ = d.step()
    assert [(s.request_id, s.start_pos, len(s.token_ids), s.sample) for s in plan.seqs] == [
        ("r0", 4, 1, True),
        ("r1", 4, 1, True),
        ("r2", 2, 2, True),
    ]
    d.run()
    assert_drained(core)


def test_fcfs_a_waiting_request_that_cannot_fit_blocks_later_ones() -> None:
    core = make_core(num_blocks=8, block_size=4)
    d = Driver(core)
    d.add("big_running", prompt_of(16), max_tokens=8)  # 4 blocks, growing to 6
    d.step()
    d.add("head", prompt_of(20, start=40), max_tokens=2)  # needs 5 blocks: cannot fit while big runs
    d.add("small", prompt_of(2, start=70), max_tokens=2)  # would fit at once
    while "big_running" not in d.finished:
        plan, _ = d.step()
        if "big_running" not in d.finished:
            assert plan_ids(plan) == ["big_running"], "admitted around the head of the queue"
    plan, _ = d.step()
    assert plan_ids(plan) == ["head", "small"]  # the head first, then what still fits
    d.run()
    first_seen = {}
    for i, p in enumerate(d.plans):
        for rid in plan_ids(p):
            first_seen.setdefault(rid, i)
    assert first_seen["head"] <= first_seen["small"]
    assert_drained(core)


# -- chunked prefill ----------------------------------------------------------------------------------


def test_chunked_prefill_never_starves_running_decodes() -> None:
    core = make_core(max_num_batched_tokens=8, num_blocks=64)
    d = Driver(core)
    d.add("a", prompt_of(3), max_tokens=30)
    d.add("b", prompt_of(3, start=50), max_tokens=30)
    d.step()
    d.step()  # both decoding now
    d.add("long", prompt_of(30, start=200), max_tokens=2)

    chunks = []
    while True:
        plan, _ = d.step()
        ids = plan_ids(plan)
        assert ids[:2] == ["a", "b"], "a running decode missed a step"
        assert [len(item(plan, r).token_ids) for r in ("a", "b")] == [1, 1]
        s = item(plan, "long")
        assert len(s.token_ids) <= 6 and plan.num_tokens <= 8
        chunks.append(s)
        if s.sample:
            break
    assert len(chunks) == 5  # 30 prompt tokens, 6 a step
    assert [c.start_pos for c in chunks] == [0, 6, 12, 18, 24]
    assert sum((c.token_ids for c in chunks), []) == prompt_of(30, start=200)
    assert [c.sample for c in chunks] == [False] * 4 + [True]
    assert not any(x.request_id == "long" for x in d.deltas[:-3])  # no token before its prompt is done
    d.run()
    assert_drained(core)


def test_long_prompt_alone_is_split_by_the_budget() -> None:
    core = make_core(max_num_batched_tokens=5, block_size=4)
    d = Driver(core)
    d.add("a", prompt_of(12), max_tokens=1)
    sizes = []
    while "a" not in d.finished:
        plan, _ = d.step()
        sizes.append(len(plan.seqs[0].token_ids))
        assert len(plan.seqs[0].block_table) == -(-(plan.seqs[0].start_pos + sizes[-1]) // 4)
    assert sizes == [5, 5, 2]
    assert_drained(core)


# -- prefix caching --------------------------------------------------------------------------------------


def test_prefix_cache_hit_after_the_first_request_finished() -> None:
    core = make_core(block_size=4)
    d = Driver(core)
    shared = prompt_of(12)
    d.add("a", shared, max_tokens=1)
    plan, _ = d.step()
    a_table = plan.seqs[0].block_table
    assert_drained(core)  # cached blocks sit in the free queue

    d.add("b", shared[:8] + [90, 91, 92], max_tokens=1)
    plan, _ = d.step()
    s = plan.seqs[0]
    assert s.start_pos == 8
    assert s.token_ids == [90, 91, 92]
    assert s.block_table[:2] == a_table[:2]
    assert core.requests.get("b") is None  # finished (max_tokens=1)
    stats = core.statistics()
    assert stats["prefix_hits"] == 2
    assert stats["prefill_tokens"] == 12 + 3
    assert_drained(core)


@pytest.mark.parametrize(("length", "expected_start"), [(12, 8), (8, 4), (9, 8), (4, 0), (3, 0)])
def test_identical_prompt_always_recomputes_at_least_one_token(length: int, expected_start: int) -> None:
    core = make_core(block_size=4)
    d = Driver(core)
    prompt = prompt_of(length)
    d.add("a", prompt, max_tokens=1)
    d.step()
    d.add("b", prompt, max_tokens=1)
    plan, _ = d.step()
    s = plan.seqs[0]
    assert s.start_pos == expected_start
    assert s.token_ids == prompt[expected_start:]
    assert len(s.token_ids) >= 1 and s.sample
    assert_drained(core)


def test_concurrent_requests_share_prefix_blocks() -> None:
    core = make_core(block_size=4)
    d = Driver(core)
    system = prompt_of(8)
    d.add("a", system + [60, 61], max_tokens=4)
    plan, _ = d.step()  # a's first two blocks are published once computed
    a_table = item(plan, "a").block_table
    d.add("b", system + [70, 71, 72], max_tokens=4)
    plan, _ = d.step()
    assert plan_ids(plan) == ["a", "b"]
    b = item(plan, "b")
    assert b.start_pos == 8 and b.token_ids == [70, 71, 72]
    assert b.block_table[:2] == a_table[:2]
    assert b.block_table[2] != item(plan, "a").block_table[2]
    assert [core.blocks.blocks[i].ref_count for i in a_table[:2]] == [2, 2]
    seq_b = core.requests["b"]
    assert seq_b.num_cached_tokens == 8
    d.run()
    assert_drained(core)


def test_request_with_cache_hit_has_correct_outputs_and_no_leak() -> None:
    core = make_core(block_size=4, num_blocks=16)
    d = Driver(core)
    base = prompt_of(16)
    for i in range(6):
        d.add(f"r{i}", base[: 8 + i] + [80 + i], max_tokens=5)
    d.run()
    for i in range(6):
        rid = f"r{i}"
        n = len(d.prompts[rid])
        assert d.outputs[rid] == [default_token(rid, n + k) for k in range(5)]
    assert core.statistics()["prefix_hits"] > 0
    assert_drained(core)



def test_follow_up_turn_hits_the_cache_after_concurrent_first_turns() -> None:
    # Two conversations with the same system prompt start in the same step; neither has
    # published the system blocks yet, so b computes a private copy of them.
    core = make_core(block_size=4)
    d = Driver(core)
    system = prompt_of(8)
    d.add("a", system + [60, 61, 62, 63], max_tokens=1)
    d.add("b", system + [70, 71, 72, 73], max_tokens=1)
    plan, _ = d.step()
    assert plan_ids(plan) == ["a", "b"] and [s.start_pos for s in plan.seqs] == [0, 0]
    # b's second turn: its first turn's prompt and answer, then the new user text.
    follow_up = d.full("b") + [80, 81, 82]
    d.add("b2", follow_up, max_tokens=1)
    plan, _ = d.step()
    assert item(plan, "b2").start_pos == 12, "b's own user block was computed after the same 8 tokens"
    assert_drained(core)

# -- preemption ---------------------------------------------------------------------------------------------


def test_preemption_of_latest_admitted_and_correct_resume() -> None:
    # 6 blocks of 4: a and b (8-token prompts) take 2 each, grow to 3 each, then a needs a 4th.
    core = make_core(num_blocks=6, block_size=4, max_num_seqs=2)
    d = Driver(core)
    d.add("a", prompt_of(8), max_tokens=12)
    d.add("b", prompt_of(8, start=40), max_tokens=12)
    d.add("c", prompt_of(3, start=70), max_tokens=2)  # waits: no seat

    plan, _ = d.step()
    assert plan_ids(plan) == ["a", "b"]
    preempt_plan = None
    while preempt_plan is None:
        plan, _ = d.step()
        if core.statistics()["preemptions"]:
            preempt_plan = plan
    assert plan_ids(preempt_plan) == ["a"], "the latest admitted goes first"
    assert core.requests["b"].num_preemptions == 1 and core.requests["a"].num_preemptions == 0
    assert [s.request_id for s in core.waiting] == ["b", "c"], "preempted goes to the front of waiting"
    b_outputs_before = list(d.outputs["b"])
    assert b_outputs_before  # b had generated tokens that must be fed again

    resumed = None
    while resumed is None:
        plan, _ = d.step()
        assert "c" not in plan_ids(plan) or "b" in plan_ids(plan), "c admitted ahead of the preempted b"
        if "b" in plan_ids(plan):
            resumed = item(plan, "b")
    full = d.prompts["b"] + b_outputs_before
    # a grew into b's freed blocks tail first, so b's head block was still cached.
    assert resumed.start_pos == 4
    assert resumed.token_ids == full[resumed.start_pos :]
    assert resumed.start_pos + len(resumed.token_ids) == len(full)
    assert len(resumed.token_ids) >= 1 and resumed.sample
    d.run()
    for rid in ("a", "b"):
        n = len(d.prompts[rid])
        assert d.outputs[rid] == [default_token(rid, n + k) for k in range(12)], rid
        assert d.finished[rid].finish_reason is FinishReason.LENGTH
    assert_drained(core)


def test_preempted_request_is_recomputed_from_scratch_when_its_cache_was_evicted() -> None:
    core = make_core(num_blocks=6, block_size=4, max_num_seqs=2)
    d = Driver(core)
    d.add("a", prompt_of(8), max_tokens=14)
    d.add("b", prompt_of(8, start=40), max_tokens=14)
    while not core.statistics()["preemptions"]:
        d.step()
    # a keeps growing into b's freed blocks, evicting their cached content.
    d.add("c", prompt_of(7, start=90), max_tokens=1)
    d.run()
    b_plans = [item(p, "b") for p in d.plans if "b" in plan_ids(p)]
    assert [len(s.token_ids) for s in b_plans[:5]] == [8, 1, 1, 1, 1]  # prefill, 4 decodes, preempted
    resumed = b_plans[5]
    # Every block b had was handed to a: the resume recomputes prompt and outputs from position 0.
    assert resumed.start_pos == 0
    assert resumed.token_ids == prompt_of(8, start=40) + [default_token("b", 8 + k) for k in range(5)]
    assert resumed.sample
    assert d.outputs["b"] == [default_token("b", 8 + k) for k in range(14)]
    assert_drained(core)


def test_preemption_under_heavy_contention_loses_no_tokens() -> None:
    core = make_core(num_blocks=10, block_size=4, max_num_seqs=6, max_num_batched_tokens=12)
    d = Driver(core)
    for i in range(8):
        d.add(f"r{i}", prompt_of(5 + i, start=10 * i), max_tokens=6 + i)
    d.run()
    assert core.statistics()["preemptions"] > 0
    for i in range(8):
        rid = f"r{i}"
        n = len(d.prompts[rid])
        assert d.outputs[rid] == [default_token(rid, n + k) for k in range(6 + i)], rid
    assert_drained(core)



def test_resume_after_preemption_is_chunked_and_samples_only_at_its_end() -> None:
    core = make_core(num_blocks=7, block_size=4, max_num_seqs=2, max_num_batched_tokens=4)
    d = Driver(core)
    d.add("a", prompt_of(6), max_tokens=16)
    d.add("b", prompt_of(6, start=40), max_tokens=10)
    d.run()
    assert core.requests == {} and core.num_preemptions == 1
    b_items = [item(p, "b") for p in d.plans if "b" in plan_ids(p)]
    ends = [x.start_pos + len(x.token_ids) for x in b_items]
    first_resume = next(i for i in range(1, len(b_items)) if b_items[i].start_pos < ends[i - 1])  # went back
    resume = b_items[first_resume:]
    # 12 tokens known (6 prompt, 6 generated), 4 from the cache, 8 fed in chunks of 4.
    assert [(x.start_pos, len(x.token_ids), x.sample) for x in resume[:3]] == [(4, 4, False), (8, 4, False), (12, 1, True)]
    full_b = d.prompts["b"] + d.outputs["b"]
    assert resume[0].token_ids + resume[1].token_ids == full_b[4:12]
    assert d.outputs["b"] == [default_token("b", 6 + k) for k in range(10)]
    assert_drained(core)

# -- abort ------------------------------------------------------------------------------------------------


def test_abort_while_waiting() -> None:
    core = make_core(max_num_seqs=1)
    d = Driver(core)
    d.add("a", prompt_of(4), max_tokens=3)
    d.add("b", prompt_of(4, start=30), max_tokens=3)
    d.step()
    assert core.statistics()["waiting"] == 1
    assert core.abort("b") is True
    assert core.abort("b") is False
    assert core.statistics()["waiting"] == 0
    plan, _ = d.step()
    assert plan.freed_request_ids == ("b",)
    d.run()
    assert "b" not in d.outputs
    assert all(p.seqs[0].request_id == "a" for p in d.plans)
    assert_drained(core)


def test_abort_while_running_frees_blocks_and_ignores_late_result() -> None:
    core = make_core()
    d = Driver(core)
    d.add("a", prompt_of(9), max_tokens=5)
    d.add("b", prompt_of(5, start=30), max_tokens=3)
    d.step()
    used_by_both = core.statistics()["kv_blocks_used"]
    plan = d.schedule()
    assert plan_ids(plan) == ["a", "b"]
    assert core.abort("a") is True
    assert core.statistics()["kv_blocks_used"] == used_by_both - 3
    deltas = d.update(plan, d.result(plan))  # the step was in flight: a's token is dropped
    assert [x.request_id for x in deltas] == ["b"]
    assert len(d.outputs["a"]) == 1
    plan, _ = d.step()
    assert plan_ids(plan) == ["b"]
    assert plan.freed_request_ids == ("a",)
    d.run()
    assert_drained(core)


def test_abort_everything_mid_prefill() -> None:
    core = make_core(max_num_batched_tokens=4)
    d = Driver(core)
    d.add("a", prompt_of(10), max_tokens=5)
    plan = d.schedule()
    assert plan.seqs[0].sample is False
    assert core.abort("a")
    assert d.update(plan, d.result(plan)) == []
    assert_drained(core)


def test_step_error_aborts_every_request_in_the_step() -> None:
    core = make_core()
    d = Driver(core)
    d.add("a", prompt_of(5), max_tokens=5)
    d.add("b", prompt_of(5, start=30), max_tokens=5)
    plan = d.schedule()
    deltas = core.update(plan, StepResult(step_id=plan.step_id, sampled={}, error="boom"))
    assert [(x.request_id, x.finish_reason, x.error, x.token_ids) for x in deltas] == [
        ("a", FinishReason.ABORT, "boom", []),
        ("b", FinishReason.ABORT, "boom", []),
    ]
    assert_drained(core)


# -- finish reasons ------------------------------------------------------------------------------------------


def _token_at(special: dict[int, int]) -> Callable[[str, int], int]:
    return lambda rid, pos: special.get(pos, default_token(rid, pos))


def test_eos_finishes_with_stop() -> None:
    core = make_core()
    d = Driver(core, _token_at({6: EOS}))
    d.add("a", prompt_of(4), max_tokens=10)
    d.run()
    fin = d.finished["a"]
    assert (fin.finish_reason, fin.stop_token_id, fin.token_ids) == (FinishReason.STOP, None, [EOS])
    assert len(d.outputs["a"]) == 3
    assert_drained(core)


def test_stop_token_ids_finish_with_the_token() -> None:
    core = make_core()
    d = Driver(core, _token_at({5: 7}))
    d.add("a", prompt_of(4), max_tokens=10, stop_token_ids=(7, 8))
    d.run()
    fin = d.finished["a"]
    assert (fin.finish_reason, fin.stop_token_id, fin.token_ids) == (FinishReason.STOP, 7, [7])
    assert d.outputs["a"] == [default_token("a", 4), 7]
    assert_drained(core)


def test_ignore_eos_runs_to_max_tokens() -> None:
    core = make_core()
    d = Driver(core, _token_at({5: EOS, 6: EOS}))
    d.add("a", prompt_of(4), max_tokens=6, ignore_eos=True)
    d.run()
    fin = d.finished["a"]
    assert fin.finish_reason is FinishReason.LENGTH
    assert len(d.outputs["a"]) == 6 and d.outputs["a"][1:3] == [EOS, EOS]
    assert_drained(core)


def test_stop_token_ids_apply_even_with_ignore_eos() -> None:
    core = make_core()
    d = Driver(core, _token_at({5: EOS}))
    d.add("a", prompt_of(4), max_tokens=6, ignore_eos=True, stop_token_ids=(EOS,))
    d.run()
    assert (d.finished["a"].finish_reason, d.finished["a"].stop_token_id) == (FinishReason.STOP, EOS)
    assert_drained(core)


def test_max_tokens_and_max_model_len_finish_with_length() -> None:
    core = make_core(max_model_len=10)
    d = Driver(core)
    d.add("short", prompt_of(4), max_tokens=2)
    d.add("ctx", prompt_of(7, start=40), max_tokens=100)
    d.run()
    assert d.finished["short"].finish_reason is FinishReason.LENGTH and len(d.outputs["short"]) == 2
    assert d.finished["ctx"].finish_reason is FinishReason.LENGTH and len(d.outputs["ctx"]) == 3
    assert_drained(core)


def test_eos_beats_length_on_the_last_token() -> None:
    core = make_core()
    d = Driver(core, _token_at({5: EOS}))
    d.add("a", prompt_of(4), max_tokens=2)
    d.run()
    assert d.finished["a"].finish_reason is FinishReason.STOP
    assert_drained(core)


# -- n > 1: forks held until the first sequence's prompt is computed --------------------------------------


def test_forks_draw_from_the_parents_last_prompt_row_and_share_its_blocks() -> None:
    core = make_core(block_size=4, max_num_batched_tokens=4)
    d = Driver(core)
    prompt = prompt_of(10)
    d.add("p", prompt, max_tokens=3)
    d.step()  # 4 of 10 prompt tokens
    d.add("p.1", prompt, max_tokens=3, fork_of="p")
    d.add("p.2", prompt, max_tokens=3, fork_of="p")
    assert core.statistics()["waiting"] == 2 and not core.waiting
    plan, _ = d.step()
    assert plan_ids(plan) == ["p"] and plan.seqs[0].forks is None
    plan, deltas = d.step()  # the prompt's last 2 tokens: the forks draw their first tokens too
    assert plan_ids(plan) == ["p"] and plan.seqs[0].sample
    assert [f.request_id for f in plan.seqs[0].forks] == ["p.1", "p.2"]
    assert sorted(x.request_id for x in deltas) == ["p", "p.1", "p.2"]
    assert core.num_prefill_tokens == 10  # the prompt was computed once for all three
    p_table = plan.seqs[0].block_table
    children = [core.requests[c].block_table for c in ("p.1", "p.2")]
    for table in children:
        assert table[:2] == p_table[:2]  # full blocks shared...
        assert table[2] != p_table[2]  # ...the partly filled one is each child's own copy
    assert [core.blocks.blocks[b].ref_count for b in p_table] == [3, 3, 1]
    plan, _ = d.step()
    assert sorted(plan.block_copies) == sorted((p_table[2], table[2]) for table in children)
    assert plan_ids(plan) == ["p", "p.1", "p.2"] and all(s.start_pos == 10 for s in plan.seqs)
    d.run()
    assert {rid: len(d.outputs[rid]) for rid in ("p", "p.1", "p.2")} == {"p": 3, "p.1": 3, "p.2": 3}
    assert core.num_prefill_tokens == 10
    assert_drained(core)


def test_forks_of_a_block_aligned_prompt_copy_nothing() -> None:
    core = make_core(block_size=4, max_num_batched_tokens=16)
    d = Driver(core)
    d.add("p", prompt_of(8), max_tokens=2)
    d.add("p.1", prompt_of(8), max_tokens=2, fork_of="p")
    plan, _ = d.step()
    assert [f.request_id for f in plan.seqs[0].forks] == ["p.1"]
    assert core.requests["p.1"].block_table == plan.seqs[0].block_table
    plan, _ = d.step()
    assert plan.block_copies == () and plan_ids(plan) == ["p", "p.1"]
    d.run()
    assert core.num_prefill_tokens == 8
    assert_drained(core)


def test_a_fork_without_a_free_block_falls_back_to_the_prefix_cache() -> None:
    core = make_core(num_blocks=4, block_size=4, max_num_batched_tokens=16)
    d = Driver(core)
    for rid in ("p", "p.1", "p.2"):
        d.add(rid, prompt_of(10), max_tokens=2, fork_of=None if rid == "p" else "p")
    plan, deltas = d.step()  # 3 blocks for p, 1 reserved for p.1, none left for p.2
    assert [f.request_id for f in plan.seqs[0].forks] == ["p.1"]
    assert sorted(x.request_id for x in deltas) == ["p", "p.1"]
    assert [s.request_id for s in core.waiting] == ["p.2"]
    d.run()
    assert all(len(d.outputs[rid]) == 2 for rid in ("p", "p.1", "p.2"))
    assert_drained(core)


def test_a_fork_aborted_during_its_draw_leaks_nothing() -> None:
    core = make_core(block_size=4, max_num_batched_tokens=16)
    d = Driver(core)
    for rid in ("p", "p.1", "p.2"):
        d.add(rid, prompt_of(10), max_tokens=2, fork_of=None if rid == "p" else "p")
    plan = d.schedule()
    assert plan is not None and len(plan.seqs[0].forks) == 2
    assert core.abort("p.1")
    deltas = d.update(plan, d.result(plan))
    assert sorted(x.request_id for x in deltas) == ["p", "p.2"]
    d.run()
    assert_drained(core)


def test_a_request_that_fails_alone_leaves_its_step_standing() -> None:
    core = make_core(block_size=4, max_num_batched_tokens=32)
    d = Driver(core)
    d.add("a", prompt_of(5), max_tokens=4)
    d.add("b", prompt_of(6), max_tokens=4)
    d.add("b.1", prompt_of(6), max_tokens=4, fork_of="b")
    plan = d.schedule()
    assert plan is not None
    whole = d.result(plan)
    sampled = {rid: token for rid, token in whole.sampled.items() if rid not in ("a", "b.1")}
    result = msgspec.structs.replace(whole, sampled=sampled, failed={"a": "grammar error: x", "b.1": "sampling failed: y"})
    deltas = {x.request_id: x for x in d.update(plan, result)}
    assert deltas["a"].finish_reason is FinishReason.ABORT and deltas["a"].error == "grammar error: x"
    assert deltas["b.1"].finish_reason is FinishReason.ABORT and deltas["b.1"].error == "sampling failed: y"
    assert deltas["b"].finish_reason is None and deltas["b"].token_ids
    d.run()
    assert len(d.outputs["b"]) == 4
    assert_drained(core)


def test_aborting_the_parent_releases_held_forks() -> None:
    core = make_core(max_num_batched_tokens=4)
    d = Driver(core)
    d.add("p", prompt_of(10), max_tokens=3)
    d.step()
    d.add("p.1", prompt_of(10), max_tokens=3, fork_of="p")
    d.add("p.2", prompt_of(10), max_tokens=3, fork_of="p")
    assert core.abort("p.2")
    assert core.abort("p")
    assert [s.request_id for s in core.waiting] == ["p.1"]
    d.run()
    assert len(d.outputs["p.1"]) == 3
    assert_drained(core)


# -- prompt logprobs ----------------------------------------------------------------------------------------


def _run_with_prompt_logprobs(d: Driver) -> dict[str, list[list[Logprob] | None]]:
    """Play an executor that returns a logprob entry per computed prompt position."""
    delivered: dict[str, list[list[Logprob] | None]] = defaultdict(list)
    while d.core.has_work:
        plan = d.schedule()
        assert plan is not None
        result = d.result(plan)
        for s in plan.seqs:
            # Entry j scores prompt position start_pos + 1 + j (only positions inside the prompt).
            n = len(d.prompts[s.request_id])
            entries = [
                Logprob(token_id=d.full(s.request_id)[p], logprob=-float(p))
                for p in range(s.start_pos + 1, s.start_pos + len(s.token_ids) + 1)
                if p < n
            ]
            if entries:
                result.logprobs[s.request_id] = entries
        for x in d.update(plan, result):
            delivered[x.request_id].append(x.prompt_logprobs)
    return delivered


def test_prompt_logprobs_survive_preemption_without_duplicates() -> None:
    core = make_core(num_blocks=7, block_size=4, max_num_seqs=2, max_num_batched_tokens=4)
    d = Driver(core)
    d.add("a", prompt_of(6), max_tokens=16, prompt_logprobs=0)
    d.add("b", prompt_of(6, start=40), max_tokens=10, prompt_logprobs=0)
    delivered = _run_with_prompt_logprobs(d)
    assert core.num_preemptions > 0
    for rid in ("a", "b"):
        first, *rest = delivered[rid]
        # Checked at the end: the list handed out with the first token must not grow afterwards.
        assert [(e.token_id, e.logprob) for e in first] == [(t, -float(p)) for p, t in enumerate(d.prompts[rid]) if p > 0]
        assert all(r is None for r in rest)
    assert_drained(core)


def test_prompt_logprobs_collected_across_chunks_delivered_once() -> None:
    core = make_core(block_size=4, max_num_batched_tokens=4)
    d = Driver(core)
    prompt = prompt_of(10)
    d.add("a", prompt, max_tokens=3, prompt_logprobs=0)
    d.add("a_again", prompt, max_tokens=1, prompt_logprobs=0)  # no cache: every position is needed
    delivered = _run_with_prompt_logprobs(d)
    for rid in ("a", "a_again"):
        first, *rest = delivered[rid]
        assert [e.token_id for e in first] == prompt[1:], rid
        assert [e.logprob for e in first] == [-float(p) for p in range(1, 10)]
        assert all(r is None for r in rest)
    assert [s.start_pos for p in d.plans for s in p.seqs if s.request_id == "a_again"][0] == 0
    assert_drained(core)


def test_a_step_holds_at_most_max_adapters_lora_adapters_and_a_request_for_another_never_starves() -> None:
    """--max-loras 2, requests for adapters a and b arriving every step: c's request waits for a
    slot while the base's and a's behind it pass; b (fewest running) starts nothing new until c
    runs, which it does while a and b keep arriving; no step ever carries three adapters."""
    driver = Driver(make_core(max_adapters=2, max_num_seqs=16))
    driver.add("a0", prompt_of(5), max_tokens=6, adapter="a")
    driver.add("a1", prompt_of(5), max_tokens=6, adapter="a")
    driver.add("b0", prompt_of(5), max_tokens=6, adapter="b")
    driver.add("c0", prompt_of(5), max_tokens=4, adapter="c")
    driver.add("base", prompt_of(5), max_tokens=4)
    carried: list[set[str | None]] = []
    for step in range(60):
        if step < 40:
            for adapter in "ab":
                driver.add(f"{adapter}-{step}", prompt_of(5), max_tokens=6, adapter=adapter)
        plan = driver.schedule()
        if plan is None:
            break
        carried.append({driver.core.requests[s.request_id].sampling.adapter for s in plan.seqs})
        driver.update(plan, driver.result(plan))
    assert max(len(c - {None}) for c in carried) == 2
    started_c = next(i for i, c in enumerate(carried) if "c" in c)
    assert None in carried[0] and "c" not in carried[0] and started_c < 20, started_c  # the base passed c; c started while a and b kept coming
    before = {s.request_id for plan in driver.plans[:started_c] for s in plan.seqs}
    assert any(r.startswith("a-") for r in before) and not any(r.startswith("b-") for r in before)  # a's passed c, b drained for it
    assert not driver.core.has_work and all(r in driver.finished for r in ("a0", "a1", "b0", "c0", "base", "a-39", "b-39"))
