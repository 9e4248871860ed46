"""Turning the scheduler core's decisions into frozen `StepPlan`s. Pure: no torch, no trio.

Owns: `PlanBuilder`: step ids, the requests freed since the last plan (the runner drops what it
keeps of them), the copy-on-write block copies due before the next forward, and introducing
each request to the runner exactly once (its `NewRequest`, with which the grammar matcher
and the prompt's images change hands). Every container a plan holds is its own: tuples, and fresh slices of the
core's lists, so the device thread never reads what the core goes on writing.
"""

from __future__ import annotations

import msgspec

from actors.sequence import Sequence
from runtime.messages import PENDING_TOKEN, ForkedSeq, NewRequest, ScheduledSeq, StepPlan


class PlanBuilder:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.next_step_id = 0
        self.freed: list[str] = []  # finished or aborted since the last plan
        # A forked sibling's copy of its parent's partly filled last block, reserved while
        # planning one step and run by the next, whose forward has written the source by then.
        self.reserved_copies: list[tuple[int, int]] = []  # reserved while planning this step
        self._due_copies: list[tuple[int, int]] = []  # reserved by the previous one: run now

    def seq(self, seq: Sequence, num_new: int, forks: tuple[ForkedSeq, ...] | None = None, draft: list[int] | None = None) -> ScheduledSeq:
        """`seq`'s next `num_new` tokens, from its computed position, and a draft to verify."""
        start = seq.num_computed_tokens
        end = start + num_new
        scheduled = self._scheduled(seq, seq.token_ids[start:end] + (draft or []), start, forks)
        if draft:
            scheduled = msgspec.structs.replace(scheduled, num_draft_tokens=len(draft))
        forced_pos, forced = seq.forced_to_score(start, end)  # a thinking budget's tokens, to score for their logprobs
        return msgspec.structs.replace(scheduled, forced_ids=forced, forced_pos=forced_pos) if forced else scheduled

    def ahead(self, seq: Sequence) -> ScheduledSeq:
        """`seq`'s decode after the step in flight: it feeds the token that step is sampling,
        which the core has not learned yet (the runner has: PENDING_TOKEN)."""
        return self._scheduled(seq, [PENDING_TOKEN], seq.num_tokens, None)

    def _scheduled(self, seq: Sequence, tokens: list[int], start: int, forks: tuple[ForkedSeq, ...] | None) -> ScheduledSeq:
        end = start + len(tokens)  # a draft's positions included: its blocks are reserved too
        return ScheduledSeq(
            request_id=seq.request_id,
            token_ids=tokens,
            start_pos=start,
            block_table=seq.block_table[: -(-end // self.block_size)],
            sample=end >= seq.num_tokens,
            sampling=seq.sampling,
            seed=seq.seed,
            num_prompt_tokens=seq.num_prompt_tokens,
            forks=forks,
        )

    def plan(self, seqs: list[ScheduledSeq], introduced: list[Sequence]) -> StepPlan:
        """The next plan: `seqs`, with a NewRequest for each of `introduced` the runner has
        not met yet, and whatever was freed and copied since the last one."""
        new = [self._introduce(seq) for seq in introduced if not seq.introduced]
        plan = StepPlan(
            step_id=self.next_step_id,
            seqs=tuple(seqs),
            new_requests=tuple(new),
            freed_request_ids=tuple(self.freed),
            block_copies=tuple(self._due_copies),
        )
        self.next_step_id += 1
        self.freed, self._due_copies, self.reserved_copies = [], self.reserved_copies, []
        return plan

    @staticmethod
    def _introduce(seq: Sequence) -> NewRequest:
        """The runner's copy of what it keeps of `seq`; the grammar matcher changes hands here."""
        seq.introduced = True
        matcher, seq.matcher = seq.matcher, None
        mm, seq.mm = seq.mm, None
        return NewRequest(request_id=seq.request_id, prompt_token_ids=tuple(seq.token_ids[: seq.num_prompt_tokens]), matcher=matcher, mm=mm)
