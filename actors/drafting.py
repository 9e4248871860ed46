"""Speculative decoding's drafts: n-gram lookup over a request's own tokens. Pure: no torch, no trio.

Owns: `NgramIndex` (per request: where each recent n-gram last occurred, so a draft is found in
constant time per step, not by rescanning the history), `Drafter` (which requests draft, how
many tokens, and what each has had accepted) and `attach_drafts`, which the scheduler core
calls on a step it has planned.

A draft is the tokens that followed the latest earlier occurrence of the request's last n
tokens (prompt lookup decoding: answers that quote, extract or rewrite their prompt repeat long
runs of it). The runner samples every verify row exactly as it would sample that position
without a draft (the same seed and position, so the same uniform), and keeps drafts while they
equal what it sampled: for a draft that is one token for sure, that is rejection sampling
exactly, so the output is token for token what the step-by-step loop gives.

How much to draft comes from the step cost fit (actors/step_cost.py): a draft of k tokens turns
a decode row into a chunk of k + 1 tokens; it is worth it while the tokens it is expected to add
(from the request's own acceptance so far) raise the step's tokens per second. At wide batches,
where a token costs what a decode row does, it turns itself off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from actors.blocks import BlockManager
from actors.sequence import Sequence
from actors.step_cost import StepCostModel

NGRAM_SIZES = (4, 3, 2)  # longest first: a longer match predicts better
PRIOR_ACCEPTANCE = 0.5  # a request's acceptance before it has drafted
ACCEPTANCE_WEIGHT = 0.3  # the moving average's weight of the latest step
MIN_GAIN = 1.05  # a draft must promise at least this much more tokens per second


@dataclass(slots=True)
class NgramIndex:
    """For each n in NGRAM_SIZES, the n-gram → the position just after its latest occurrence."""

    seen: int = 0  # tokens indexed so far
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed an earlier occurrence of the current suffix."""
        self._catch_up(tokens, upto=len(tokens) - 1)  # every n-gram ending before the last token
        for n in NGRAM_SIZES:
            if len(tokens) <= n:
                continue
            end = self.ends.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end : end + k]
        return []

    def _catch_up(self, tokens: list[int], upto: int) -> None:
        for end in range(max(self.seen, 1), upto + 1):
            for n in NGRAM_SIZES:
                if end >= n:
                    self.ends[tuple(tokens[end - n : end])] = end
        self.seen = max(self.seen, upto + 1)


class Drafter:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._index: dict[str, NgramIndex] = {}
        self._acceptance: dict[str, float] = {}
        self.num_drafted = 0  # lifetime, for the metrics
        self.num_accepted = 0

    def propose(self, seq: Sequence, k: int) -> list[int]:
        index = self._index.setdefault(seq.request_id, NgramIndex())
        return index.propose(seq.token_ids, k)

    def acceptance(self, request_id: str) -> float:
        return self._acceptance.get(request_id, PRIOR_ACCEPTANCE)

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.num_drafted += drafted
        self.num_accepted += accepted
        rate = accepted / drafted
        self._acceptance[request_id] = (1 - ACCEPTANCE_WEIGHT) * self.acceptance(request_id) + ACCEPTANCE_WEIGHT * rate

    def forget(self, request_id: str) -> None:
        self._index.pop(request_id, None)
        self._acceptance.pop(request_id, None)

    def wants(self, cost: StepCostModel, request_ids: list[str]) -> bool:
        """Whether any of these decoding requests would draft in a step of them all."""
        return any(self.worth(cost, len(request_ids), rid) > 0 for rid in request_ids)

    def worth(self, cost: StepCostModel, rows: int, request_id: str) -> int:
        """How many tokens to draft for one of `rows` decoding requests (0: none)."""
        alpha = self.acceptance(request_id)
        base = cost.predict(rows, 0)
        if base is None or base <= 0:
            return self.max_tokens  # no fit yet: draft, and let the measured steps decide
        best, best_rate = 0, rows / base * MIN_GAIN  # what the fit does not see (drafting's own time) must be paid for
        for k in range(1, self.max_tokens + 1):
            expected = sum(alpha**i for i in range(1, k + 1))
            seconds = cost.predict(rows, k)  # its decode row, plus k more tokens to verify
            if seconds is not None and seconds > 0 and (rows + expected) / seconds > best_rate:
                best, best_rate = k, (rows + expected) / seconds
        return best


class Core(Protocol):
    """What of `SchedulerCore` drafting reads (and, for the drafts' blocks, writes)."""

    blocks: BlockManager
    step_cost: StepCostModel
    waiting: deque[Sequence]


def attach_drafts(core: Core, drafter: Drafter, scheduled: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
    """Drafts for the decode rows of a planned step, with their blocks reserved. Only a step of
    decodes alone drafts (a prompt chunk's share of the step is the step budget's), and not a
    request whose grammar matcher would have to be advanced over the draft to mask its verify
    rows, nor one with siblings still to fork, nor one still thinking within a budget (the
    budget may end its thinking at any token). Penalties and logprobs hold: a verify row counts
    the draft tokens before it, and each kept token's logprob comes from its own row."""
    if core.waiting or any(n != 1 for _, n in scheduled):
        return {}
    drafts: dict[str, list[int]] = {}
    rows = len(scheduled)
    for seq, _ in scheduled:
        params = seq.sampling
        if seq.num_output_tokens == 0 or params.guide is not None:
            continue
        if seq.thinking is not None and not seq.thinking.done:  # the budget may end thinking inside a draft
            continue
        room = min(seq.max_tokens - seq.num_output_tokens - 1, drafter.worth(core.step_cost, rows, seq.request_id))
        draft = drafter.propose(seq, room) if room > 0 else []
        need = core.blocks.blocks_needed(seq.num_tokens + len(draft)) - len(seq.block_table)
        if not draft or not core.blocks.can_allocate(need):
            continue
        seq.block_table += core.blocks.allocate(need)
        drafts[seq.request_id] = draft
    return drafts
