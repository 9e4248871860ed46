"""Speculative decoding's drafts: n-gram lookup over a request's own tokens, then over what
finished requests wrote. Pure: no torch, no trio.

Owns: `NgramIndex` (per request: where each recent n-gram last occurred, so a draft is found in
constant time per step, not by rescanning the history), `NgramPool` (bounded, shared by every
request: the n-grams of finished requests' outputs and what followed them), `Drafter` (which
requests draft, how many tokens, and what each has had accepted) and `attach_drafts`, which the
scheduler core calls on a step it has planned.

A draft is the tokens that followed the latest earlier occurrence of the request's last n
tokens (prompt lookup decoding: answers that quote, extract or rewrite their prompt repeat long
runs of it); where its own tokens have no such occurrence, the tokens that followed the same
n-gram in an earlier request's output (answers to similar requests repeat each other: the same
JSON keys, the same boilerplate, the same code). The runner samples every verify row exactly as it would sample that position
without a draft (the same seed and position, so the same uniform), and keeps drafts while they
equal what it sampled: for a draft that is one token for sure, that is rejection sampling
exactly, so the output is token for token what the step-by-step loop gives. How much to draft
comes from the step cost fit (`Drafter.worth`); at wide batches it turns itself off.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

from actors.blocks import BlockManager
from actors.sequence import Sequence
from actors.step_cost import StepCostModel

NGRAM_SIZES = (4, 3, 2)  # longest first: a longer match predicts better
PRIOR_ACCEPTANCE = 0.5  # a request's acceptance before it has drafted
ACCEPTANCE_WEIGHT = 0.3  # the moving average's weight of the latest step
MIN_GAIN = 1.05  # a draft must promise at least this much more tokens per second
# `--spec-decoding auto` drafts only in steps of at most this many decode rows. Wider, the fit's
# promise did not hold: a verify row is attended on the prompt path, and a step that drafts is
# not planned ahead (async scheduling's overlap is lost), so drafting at c = 32 read 0.81-0.88
# of drafting off while c = 1 read 1.9-2.2x (ops/results/spec-ngram-vs-off-c1-c64-2026-11-26-xeon-amx.json).
# `ngram` and `draft` keep the fit's rule alone.
AUTO_MAX_ROWS = 4
# The shared pool: how many n-grams it keeps (least recently used out first; ~100 bytes each),
# and how much of a finished request's output it takes (its end: the most recent text).
POOL_CAPACITY = 1 << 16
POOL_TOKENS_PER_REQUEST = 1024


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


class NgramPool:
    """n-gram → the tokens that followed it in a finished request's output (the latest such),
    for every n in NGRAM_SIZES; at most `capacity` n-grams, the least recently used out first.
    Each key starts with its requests' LoRA adapter (None: the base model): an adapter drafts
    only from its own requests' outputs, as its prefix cache holds only its own KV."""

    def __init__(self, capacity: int, span: int) -> None:
        self.capacity = capacity
        self.span = span  # tokens kept after each n-gram: the longest draft
        self._next: OrderedDict[tuple[str | int | None, ...], tuple[int, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._next)

    def add(self, tokens: list[int], first_output: int, adapter: str | None = None) -> None:
        """Learn the n-grams of a finished request's output (`tokens[first_output:]`, its last
        POOL_TOKENS_PER_REQUEST), each n-gram's key starting up to n - 1 tokens before it."""
        start = max(first_output, len(tokens) - POOL_TOKENS_PER_REQUEST)
        entries = self._next
        for end in range(max(start, 1), len(tokens)):  # an n-gram with at least one token after it
            follow = tuple(tokens[end : end + self.span])
            for n in NGRAM_SIZES:
                if end >= n:
                    key = (adapter, *tokens[end - n : end])
                    entries[key] = follow
                    entries.move_to_end(key)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def propose(self, tokens: list[int], k: int, adapter: str | None = None) -> list[int]:
        for n in NGRAM_SIZES:
            if len(tokens) < n:
                continue
            key = (adapter, *tokens[-n:])
            follow = self._next.get(key)
            if follow is not None:
                self._next.move_to_end(key)
                return list(follow[:k])
        return []


class Drafter:
    def __init__(self, max_tokens: int, max_rows: int | None = None, pool_capacity: int = POOL_CAPACITY) -> None:
        self.max_tokens = max_tokens
        self.max_rows = max_rows  # a step of more decode rows never drafts (`auto`: AUTO_MAX_ROWS)
        self.pool = NgramPool(pool_capacity, max_tokens)
        self._index: dict[str, NgramIndex] = {}
        self._acceptance: dict[str, float] = {}
        self.num_drafted = 0  # lifetime, for the metrics
        self.num_accepted = 0

    def propose(self, seq: Sequence, k: int) -> list[int]:
        index = self._index.setdefault(seq.request_id, NgramIndex())
        return index.propose(seq.token_ids, k) or self.pool.propose(seq.token_ids, k, seq.sampling.adapter)

    def acceptance(self, request_id: str) -> float:
        return self._acceptance.get(request_id, PRIOR_ACCEPTANCE)

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.num_drafted += drafted
        self.num_accepted += accepted
        rate = accepted / drafted
        self._acceptance[request_id] = (1 - ACCEPTANCE_WEIGHT) * self.acceptance(request_id) + ACCEPTANCE_WEIGHT * rate

    def forget(self, seq: Sequence) -> None:
        """`seq` is gone (finished, stopped, aborted: what it wrote is the model's all the
        same); its output's n-grams go to the shared pool."""
        self._index.pop(seq.request_id, None)
        self._acceptance.pop(seq.request_id, None)
        if seq.num_output_tokens > 1:
            self.pool.add(seq.token_ids, seq.num_prompt_tokens, seq.sampling.adapter)

    def wants(self, cost: StepCostModel, seqs: list[Sequence]) -> bool:
        """Whether any of these decoding requests would draft in a step of them all."""
        return any(may_draft(seq) and self.worth(cost, len(seqs), seq.request_id) > 0 for seq in seqs)

    # From the step cost fit (actors/step_cost.py): a draft of k tokens turns a decode row into a
    # chunk of k + 1 tokens; it is worth it while the tokens it is expected to add (from the
    # request's own acceptance so far) raise the step's tokens per second. At wide batches, where
    # a token costs what a decode row does, no draft is.
    def worth(self, cost: StepCostModel, rows: int, request_id: str) -> int:
        """How many tokens to draft for one of `rows` decoding requests (0: none)."""
        if self.max_rows is not None and rows > self.max_rows:
            return 0
        alpha = self.acceptance(request_id)
        base = cost.predict(rows, 0)
        if base is None or base <= 0:
            return self.max_tokens  # no fit yet: draft, and let the measured steps decide
        best, best_rate = 0, rows / base * MIN_GAIN  # what the fit does not see (drafting's own time) must be paid for
        for k in range(1, self.max_tokens + 1):
            expected = sum(alpha**i for i in range(1, k + 1))
            seconds = cost.predict_verify(rows, k)  # its decode row, plus k more tokens to verify
            if seconds is not None and seconds > 0 and (rows + expected) / seconds > best_rate:
                best, best_rate = k, (rows + expected) / seconds
        return best


class Core(Protocol):
    """What of `SchedulerCore` drafting reads (and, for the drafts' blocks, writes)."""

    blocks: BlockManager
    step_cost: StepCostModel
    waiting: deque[Sequence]


def may_draft(seq: Sequence) -> bool:
    """Whether `seq` may draft at all (how much is `Drafter.worth`'s): not before its first
    output token, not while it thinks within a budget (the budget may end thinking at any
    token), and not a grammar-constrained request that thinks first (its grammar starts where
    thinking ends, which the runner finds in its own history, not in a draft). A grammar alone
    drafts: the runner masks each verify row by the matcher advanced over the draft before it."""
    if seq.num_output_tokens == 0 or seq.num_output_tokens + 1 >= seq.max_tokens:
        return False
    if seq.thinking is not None and not seq.thinking.done:
        return False
    return not (seq.sampling.guide is not None and seq.sampling.thinking is not None)


def attach_drafts(core: Core, drafter: Drafter, scheduled: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
    """Drafts for the decode rows of a planned step, with their blocks reserved. Only a step of
    decodes alone drafts (a prompt chunk's share of the step is the step budget's; a prompt's
    siblings fork in its last chunk), and only requests that `may_draft`. Penalties and
    logprobs hold: a verify row counts the draft tokens before it, and each kept token's
    logprob comes from its own row."""
    if core.waiting or any(n != 1 for _, n in scheduled):
        return {}
    drafts: dict[str, list[int]] = {}
    rows = len(scheduled)
    for seq, _ in scheduled:
        if not may_draft(seq):
            continue
        room = min(seq.max_tokens - seq.num_output_tokens - 1, drafter.worth(core.step_cost, rows, seq.request_id))
        draft = drafter.propose(seq, room) if room > 0 else []
        need = core.blocks.blocks_needed(seq.num_tokens + len(draft)) - len(seq.block_table)
        if not draft or not core.blocks.can_allocate(need):
            continue
        seq.block_table += core.blocks.allocate(need)
        drafts[seq.request_id] = draft
    return drafts
