"""SchedulerCore driven by hand, in the style of vLLM's test_scheduler.py.

A `Driver` plays the executor: it samples a token for every seq whose `sample` is set (a pure
function of request id and position, so a request's text does not depend on batching or
preemption) and checks every plan against what it knows of each request (prompt + outputs so
far): the tokens fed are exactly the next ones, blocks being written are private, the budget
and the seat limit hold. Used by the scheduler core's tests and the step budget's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from actors.sched_core import SchedulerConfig, SchedulerCore, SeqStatus
from runtime.messages import StepPlan, StepResult, TokenDelta, TokenizedRequest
from runtime.sampling import SamplingParams

EOS = 2


def default_token(request_id: str, position: int) -> int:
    """Never EOS: 100..149, depending on the request and the position being generated."""
    return 100 + (position * 7 + sum(map(ord, request_id)) * 13) % 50


def make_core(**overrides) -> SchedulerCore:
    settings = dict(
        num_blocks=64,
        block_size=4,
        max_num_seqs=8,
        max_num_batched_tokens=32,
        max_model_len=1024,
        eos_token_ids=frozenset({EOS}),
    )
    settings.update(overrides)
    return SchedulerCore(SchedulerConfig(**settings))


def prompt_of(n: int, start: int = 10) -> list[int]:
    return [start + i for i in range(n)]


class Driver:
    def __init__(self, core: SchedulerCore, token: Callable[[str, int], int] = default_token) -> None:
        self.core = core
        self.token = token
        self.prompts: dict[str, list[int]] = {}
        self.outputs: dict[str, list[int]] = defaultdict(list)
        self.finished: dict[str, TokenDelta] = {}
        self.deltas: list[TokenDelta] = []
        self.plans: list[StepPlan] = []
        self.computed: dict[str, int] = {}  # KV computed per request as of its last plan
        self.tables: dict[str, list[int]] = {}
        self.preemptions: dict[str, int] = {}

    def add(self, request_id: str, prompt: list[int], max_tokens: int = 8, fork_of: str | None = None, **sampling) -> None:
        self.core.add(
            TokenizedRequest(
                request_id=request_id,
                prompt_token_ids=list(prompt),
                sampling=SamplingParams(**sampling),
                max_tokens=max_tokens,
                seed=0,
                arrival_time=0.0,
                fork_of=fork_of,
            )
        )
        self.prompts[request_id] = list(prompt)

    def full(self, request_id: str) -> list[int]:
        """What the plans must feed: the prompt, the outputs so far, and forced tokens the core
        holds until their logprobs come (Sequence.held)."""
        seq = self.core.requests.get(request_id)
        held = seq.token_ids[seq.held.first :] if seq is not None and seq.held is not None else []
        return self.prompts[request_id] + self.outputs[request_id] + held

    def schedule(self) -> StepPlan | None:
        plan = self.core.schedule()
        if plan is not None:
            self.check_plan(plan)
            self.plans.append(plan)
        return plan

    def result(self, plan: StepPlan, overrides: dict[str, int] | None = None) -> StepResult:
        sampled = {}
        for s in plan.seqs:
            if s.sample:
                # Forks draw from their parent's last row, each as its own request.
                for rid in [s.request_id, *(f.request_id for f in s.forks or ())]:
                    token = self.token(rid, s.start_pos + len(s.token_ids))
                    sampled[rid] = (overrides or {}).get(rid, token)
        return StepResult(step_id=plan.step_id, sampled=sampled)

    def update(self, plan: StepPlan, result: StepResult, started: float = 0.0, finished: float = 0.0) -> list[TokenDelta]:
        deltas = self.core.update(plan, result, started, finished)
        for s in plan.seqs:
            for fork in s.forks or ():
                child = self.core.requests.get(fork.request_id)
                if child is not None and child.status is SeqStatus.RUNNING:  # took the parent's prompt
                    self.computed[fork.request_id] = child.num_computed_tokens
                    self.tables[fork.request_id] = list(child.block_table)
                    self.preemptions[fork.request_id] = child.num_preemptions
        for d in deltas:
            assert d.request_id not in self.finished, f"{d.request_id} got a token after it finished"
            self.outputs[d.request_id].extend(d.token_ids)
            if d.finish_reason is not None:
                self.finished[d.request_id] = d
        self.deltas.extend(deltas)
        return deltas

    def step(self, overrides: dict[str, int] | None = None) -> tuple[StepPlan | None, list[TokenDelta]]:
        plan = self.schedule()
        if plan is None:
            return None, []
        return plan, self.update(plan, self.result(plan, overrides))

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.core.has_work:
                return
            plan, _ = self.step()
            assert plan is not None, f"stuck with work left: {self.core.statistics()}"
        raise AssertionError("did not finish")

    def check_plan(self, plan: StepPlan) -> None:
        core, cfg = self.core, self.core.config
        bs = cfg.block_size
        assert plan.seqs, "an empty plan"
        assert plan.num_tokens <= max(cfg.max_num_batched_tokens, cfg.burst_tokens)  # a burst's step may carry more
        assert all(len(s.token_ids) <= cfg.max_num_batched_tokens for s in plan.seqs)  # ...but no chunk is longer
        assert len(plan.seqs) <= cfg.max_num_seqs
        ids = [s.request_id for s in plan.seqs]
        assert len(set(ids)) == len(ids), ids
        written: set[int] = set()
        for s in plan.seqs:
            rid = s.request_id
            full = self.full(rid)
            end = s.start_pos + len(s.token_ids)
            assert len(s.token_ids) >= 1
            assert s.token_ids == full[s.start_pos : end], (rid, s.start_pos)
            assert s.sample == (end == len(full)), rid
            assert len(s.block_table) == -(-end // bs), rid
            assert s.num_prompt_tokens == len(self.prompts[rid])
            # Blocks this step writes into belong to this sequence alone.
            for b in s.block_table[s.start_pos // bs :]:
                assert core.blocks.blocks[b].ref_count == 1, (rid, b)
                assert b not in written, (rid, b)
                written.add(b)
            seq = core.requests[rid]
            assert seq.status is SeqStatus.RUNNING
            preempted = seq.num_preemptions != self.preemptions.get(rid, 0)
            if rid in self.computed and not preempted:
                # Continues exactly where the last step left it, over the same blocks.
                assert s.start_pos == self.computed[rid], rid
                prev = self.tables[rid]
                assert s.block_table[: len(prev)] == prev, rid
            else:
                # Fresh (or resumed) start: from a block boundary, the prefix cache's full blocks.
                assert s.start_pos % bs == 0 and s.start_pos < len(full), rid
            self.computed[rid] = end
            self.tables[rid] = list(s.block_table)
            self.preemptions[rid] = seq.num_preemptions


def assert_drained(core: SchedulerCore) -> None:
    stats = core.statistics()
    assert stats["kv_blocks_used"] == 0, stats
    assert stats["kv_blocks_free"] == core.config.num_blocks
    assert (stats["requests"], stats["waiting"], stats["running"]) == (0, 0, 0), stats
    assert not core.has_work
    assert all(b.ref_count == 0 for b in core.blocks.blocks)
    assert core.schedule() is None


def plan_ids(plan: StepPlan) -> list[str]:
    return [s.request_id for s in plan.seqs]


def item(plan: StepPlan, request_id: str):
    (found,) = [s for s in plan.seqs if s.request_id == request_id]
    return found
