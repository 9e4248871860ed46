"""Planning step N+1 while step N runs (async scheduling). Pure: no torch, no trio.

Owns: `plan_ahead(core, in_flight)`, the one kind of step the core can plan before it knows the
result of the step in flight: every running request decoding one more token. Each of its rows
feeds the token the step in flight is sampling (`PENDING_TOKEN`: the runner takes it from its
own history), so the device goes from one step to the next without waiting for the event loop
to apply a result and plan. Anything that needs the result first is left to the ordinary
`schedule()` after it: a prompt chunk (its next chunk's size depends on the step cost of the
one in flight), a request waiting to be admitted, siblings to fork, a request whose token in
flight is its last (max_tokens or the context length), or too few free blocks (a preemption
must see what finished). A request that the step in flight finishes by EOS or a stop token is
computed once more for nothing; `SchedulerCore.update` drops that row.

Why vLLM's async scheduling and SGLang's overlap scheduler do this: the scheduler's CPU time and
the hand-over to the device leave the step's critical path.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from actors.blocks import BlockManager
from actors.plans import PlanBuilder
from actors.sequence import SchedulerConfig, SeqStatus, Sequence
from runtime.messages import StepPlan


class Core(Protocol):
    """What of `SchedulerCore` planning ahead reads (and, for the new rows' blocks, writes)."""

    config: SchedulerConfig
    blocks: BlockManager
    plans: PlanBuilder
    waiting: deque[Sequence]
    running: list[Sequence]
    requests: dict[str, Sequence]
    forks: dict[str, list[Sequence]]


def plan_ahead(core: Core, in_flight: StepPlan) -> StepPlan | None:
    """The step after `in_flight` when it is a pure continuation of it, else None."""
    if core.waiting or core.forks or in_flight.block_copies or len(in_flight.seqs) != len(core.running):
        return None
    rows = []
    for item in in_flight.seqs:
        seq = core.requests.get(item.request_id)
        if len(item.token_ids) != 1 or not item.sample or seq is None or seq.status is not SeqStatus.RUNNING:
            return None
        if item.start_pos != seq.num_computed_tokens or seq.num_tokens != item.start_pos + 1:
            return None  # not the row the core planned last (cannot happen; never guess)
        # The token in flight is its last one: nothing to plan after it. Nor when it may be
        # its last thinking token within a budget: the core then writes the end of thinking.
        if seq.num_output_tokens + 1 >= seq.max_tokens or seq.num_tokens + 1 >= core.config.max_model_len:
            continue
        if seq.thinking is not None and seq.thinking.may_reach_budget(1):
            continue
        rows.append(seq)
    need = [core.blocks.blocks_needed(seq.num_tokens + 1) - len(seq.block_table) for seq in rows]
    if not rows or not core.blocks.can_allocate(sum(need)):
        return None
    for seq, n in zip(rows, need):
        seq.block_table += core.blocks.allocate(n)
    return core.plans.plan([core.plans.ahead(seq) for seq in rows], [])
