"""Planning step N+1 while step N runs (actors/lookahead.py), on the pure core.

A simulated device returns each step's tokens one step late, as the overlapped loop sees them:
the core plans the next step before it applies the one in flight. Every request must get
exactly the tokens the serial loop gives it, whatever finishes, leaves or arrives meanwhile,
and every block must come back.
"""

from __future__ import annotations

import random
from collections import defaultdict

from actors.sched_core import SchedulerConfig, SchedulerCore
from runtime.messages import PENDING_TOKEN, StepPlan, StepResult, TokenizedRequest
from runtime.sampling import SamplingParams

EOS = 2


def token_of(request_id: str, position: int) -> int:
    """Deterministic, like a seeded sampler: EOS for request "e" at position 14."""
    if request_id.startswith("e") and position == 14:
        return EOS
    return 100 + (position * 7 + sum(map(ord, request_id)) * 13) % 50


class Device:
    """Samples like a runner: a pending token is read from what it sampled itself."""

    def __init__(self, prompts: dict[str, list[int]]) -> None:
        self.history = {rid: list(p) for rid, p in prompts.items()}

    def run(self, plan: StepPlan) -> StepResult:
        sampled = {}
        for s in plan.seqs:
            history = self.history[s.request_id]
            for i, t in enumerate(s.token_ids):
                assert t == PENDING_TOKEN or t == history[s.start_pos + i], (s.request_id, s.start_pos + i)
            if s.sample:
                del history[s.start_pos + len(s.token_ids) :]  # a token the core never applied is forgotten
                sampled[s.request_id] = token_of(s.request_id, s.start_pos + len(s.token_ids))
                history.append(sampled[s.request_id])
        return StepResult(step_id=plan.step_id, sampled=sampled)


def make_core(num_blocks: int = 64) -> SchedulerCore:
    return SchedulerCore(SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_seqs=8, max_num_batched_tokens=32, eos_token_ids=frozenset({EOS})))


def add(core: SchedulerCore, rid: str, prompt: list[int], max_tokens: int) -> None:
    core.add(TokenizedRequest(request_id=rid, prompt_token_ids=prompt, sampling=SamplingParams(), max_tokens=max_tokens, seed=0, arrival_time=0.0))


def drive(core: SchedulerCore, arrivals: dict[int, list[tuple[str, list[int], int]]], aborts: dict[int, str], ahead: bool) -> tuple[dict[str, list[int]], int, int]:
    """Run to the end; (tokens per request, steps planned ahead, steps run). `arrivals` and
    `aborts` by loop turn."""
    prompts = {rid: p for batch in arrivals.values() for rid, p, _ in batch}
    device, outputs, planned_ahead, step, num_steps = Device(prompts), defaultdict(list), 0, 0, 0
    in_flight: list[StepPlan] = []
    while core.has_work or in_flight or any(k >= step for k in arrivals):
        for rid, prompt, max_tokens in arrivals.get(step, []):
            add(core, rid, prompt, max_tokens)
        if step in aborts:
            core.abort(aborts[step])
        step += 1
        if not in_flight:
            plan = core.schedule()
            if plan is None:
                continue
            in_flight.append(plan)
        if ahead and len(in_flight) == 1:
            next_plan = core.schedule_ahead(in_flight[0])
            if next_plan is not None:
                in_flight.append(next_plan)
                planned_ahead += 1
        plan = in_flight.pop(0)
        num_steps += 1
        for delta in core.update(plan, device.run(plan)):
            outputs[delta.request_id].extend(delta.token_ids)
    return dict(outputs), planned_ahead, num_steps


def prompts_of(arrivals: dict[int, list[tuple[str, list[int], int]]]) -> list[str]:
    return [rid for batch in arrivals.values() for rid, _, _ in batch]


def scenario(seed: int) -> tuple[dict[int, list[tuple[str, list[int], int]]], dict[int, str]]:
    rng = random.Random(seed)
    arrivals: dict[int, list[tuple[str, list[int], int]]] = defaultdict(list)
    for i in range(8):
        rid = f"{'e' if i % 3 == 0 else 'r'}{i}"
        arrivals[rng.choice([0, 0, 3, 9, 20])].append((rid, [10 + rng.randrange(50) for _ in range(rng.randrange(1, 12))], rng.randrange(1, 24)))
    return dict(arrivals), {rng.randrange(5, 30): "r1"}


def test_steps_planned_ahead_give_every_request_the_serial_tokens() -> None:
    for seed in range(12):
        arrivals, aborts = scenario(seed)
        serial, _, serial_steps = drive(make_core(), arrivals, {}, ahead=False)
        core = make_core()
        overlapped, planned_ahead, steps = drive(core, arrivals, aborts, ahead=True)
        left = set(aborts.values())
        assert {r: t for r, t in overlapped.items() if r not in left} == {r: t for r, t in serial.items() if r not in left}, seed
        for rid in left:  # it left mid-way: what it got is the start of what it would have got
            assert overlapped.get(rid, []) == serial[rid][: len(overlapped.get(rid, []))], seed
        assert planned_ahead > 0, seed
        # A step planned ahead does the work of the next one: at most a request's last row
        # (finished by EOS in the step before) is wasted, so the step count barely moves.
        assert steps <= serial_steps + len(prompts_of(arrivals)), (seed, steps, serial_steps)
        assert core.blocks.num_used_blocks == 0 and not core.requests, seed


def test_under_block_pressure_it_waits_for_the_result_instead() -> None:
    """Too few free blocks for every row's next position: no step is planned ahead (a
    preemption must see what the step in flight finished), and the tokens stay the serial ones."""
    arrivals = {0: [(f"r{i}", list(range(10, 17)), 20) for i in range(4)]}
    serial, _, _ = drive(make_core(num_blocks=12), arrivals, {}, ahead=False)
    core = make_core(num_blocks=12)
    overlapped, _, _ = drive(core, arrivals, {}, ahead=True)
    assert overlapped == serial and core.num_preemptions > 0
    assert core.blocks.num_used_blocks == 0


def test_only_a_decode_only_continuation_is_planned_ahead() -> None:
    core = make_core()
    add(core, "a", list(range(10, 20)), max_tokens=8)
    prefill = core.schedule()
    assert prefill is not None and core.schedule_ahead(prefill) is None  # a prompt chunk in flight
    core.update(prefill, StepResult(step_id=prefill.step_id, sampled={"a": 120}))
    decode = core.schedule()
    assert decode is not None
    ahead = core.schedule_ahead(decode)
    assert ahead is not None and [(s.token_ids, s.start_pos, s.sample) for s in ahead.seqs] == [([PENDING_TOKEN], 11, True)]
    add(core, "b", [10, 11], max_tokens=4)  # someone waiting: it must be admitted after the result
    assert core.schedule_ahead(decode) is None
