"""The scheduler's pure core: continuous batching over a paged KV cache. No torch, no trio.

Owns: the waiting and running queues, each request's progress (`num_computed_tokens`), block
tables, and the decisions of every step. Two calls drive it (vLLM v1's shape, nano-vllm's size):

    plan = core.schedule()          # what the next packed forward computes
    outputs = core.update(plan, result)   # what it produced; finished requests leave

Every request is "tokens whose KV is computed" plus "tokens still to feed". A prompt is fed in
chunks that fit the per-step token budget, so a long prompt never stalls running decodes: each
step first gives every running request its share (one token for a decoding request, a chunk
for one still prefilling), then admits waiting requests first-come-first-served with what is
left. When blocks run out, the most recently admitted running request is preempted by
recompute: its blocks are freed and it goes back to the front of the waiting queue, where the
prefix cache usually gives most of its blocks straight back. Nothing behind the head of the
waiting queue is admitted before it, so no request starves.
"""

from __future__ import annotations

import enum
from typing import Any
from collections import deque
from dataclasses import dataclass, field

from actors.blocks import BlockManager
from runtime.messages import (
    FinishReason,
    Logprob,
    ScheduledSeq,
    StepPlan,
    StepResult,
    TokenDelta,
    TokenizedRequest,
)
from runtime.sampling import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt then outputs
    num_prompt_tokens: int
    sampling: SamplingParams
    max_tokens: int
    seed: int
    arrival_time: float
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    last_block_hash: int | None = None
    last_block_ref: tuple[int, int] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    num_preemptions: int = 0
    admitted: bool = False
    matcher: Any = None
    prompt_logprobs: list[Logprob] = field(default_factory=list)  # collected, delivered with the first token

    @property
    def all_token_ids(self) -> list[int]:
        return self.token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 512
    max_model_len: int = 8192
    eos_token_ids: frozenset[int] = frozenset()


class SchedulerCore:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.blocks = BlockManager(config.num_blocks, config.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        self._freed_ids: list[str] = []
        # Siblings (n > 1) held back until the first sequence's prompt is computed; then its
        # full blocks are in the prefix cache and they reuse them instead of re-running prefill.
        self.forks: dict[str, list[Sequence]] = {}
        self._next_step_id = 0
        self.num_prefill_tokens = 0  # prompt tokens computed (not served from cache), lifetime
        self.num_preemptions = 0

    # -- requests in and out ------------------------------------------------------------------

    def add(self, request: TokenizedRequest) -> None:
        seq = Sequence(
            request_id=request.request_id,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            sampling=request.sampling,
            max_tokens=request.max_tokens,
            seed=request.seed,
            arrival_time=request.arrival_time,
            matcher=request.matcher,
        )
        self.requests[seq.request_id] = seq
        parent = self.requests.get(request.fork_of) if request.fork_of else None
        if parent is not None and parent.num_computed_tokens < parent.num_prompt_tokens:
            self.forks.setdefault(parent.request_id, []).append(seq)
        else:
            self.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Forget a request wherever it is; its blocks are free at once. False if unknown."""
        seq = self.requests.get(request_id)
        if seq is None:
            return False
        if seq.status is SeqStatus.WAITING:
            if seq in self.waiting:
                self.waiting.remove(seq)
            else:
                for held in self.forks.values():
                    if seq in held:
                        held.remove(seq)
        elif seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        self._finish(seq)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []

        preemptions_before = self.num_preemptions
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:  # preempted to make room for an earlier one
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._reserve_or_preempt(seq, num_new):
                break  # `seq` itself had to go: nothing behind it can run either
            scheduled.append((seq, num_new))
            budget -= num_new
        preempted = self.num_preemptions != preemptions_before

        # Admission only when nobody was preempted: a preempted request waits at the head of
        # the queue, and admitting others now would only thrash.
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                self._attach_cached_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            need = self.blocks.blocks_needed(seq.num_computed_tokens + num_new) - len(seq.block_table)
            if not self.blocks.can_allocate(need):
                self._release(seq)
                break
            seq.block_table += self.blocks.allocate(need)
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            seq.admitted = True
            self.running.append(seq)
            scheduled.append((seq, num_new))
            budget -= num_new

        if not scheduled:
            return None
        return self._make_plan(scheduled)

    def update(self, plan: StepPlan, result: StepResult) -> list[TokenDelta]:
        """Apply a step's result. Tokens for requests aborted meanwhile are dropped."""
        outputs: list[TokenDelta] = []
        batch_size = len(plan.seqs)
        for item in plan.seqs:
            seq = self.requests.get(item.request_id)
            if seq is None or seq.status is not SeqStatus.RUNNING:
                continue
            if result.error is not None:
                self.running.remove(seq)
                self._finish(seq)
                outputs.append(
                    TokenDelta(request_id=seq.request_id, token_ids=[], finish_reason=FinishReason.ABORT, error=result.error)
                )
                continue
            if len(item.token_ids) > 1 or item.start_pos < seq.num_prompt_tokens:
                self.num_prefill_tokens += len(item.token_ids)
            seq.num_computed_tokens += len(item.token_ids)
            self.blocks.commit_full_blocks(seq, seq.num_computed_tokens)
            if seq.num_computed_tokens >= seq.num_prompt_tokens and seq.request_id in self.forks:
                self._release_forks(seq.request_id)
            logprobs = result.logprobs.get(seq.request_id)
            sampled_logprob = None
            if logprobs and item.sample and seq.sampling.logprobs is not None:
                sampled_logprob, logprobs = logprobs[-1], logprobs[:-1]
            if logprobs:
                self._collect_prompt_logprobs(seq, item.start_pos, logprobs)
            if not item.sample:
                continue
            token = result.sampled[seq.request_id]
            seq.token_ids.append(token)
            finish, stop_token = self._check_finish(seq, token)
            if finish is not None:
                self.running.remove(seq)
                self._finish(seq)
            outputs.append(
                TokenDelta(
                    request_id=seq.request_id,
                    token_ids=[token],
                    finish_reason=finish,
                    stop_token_id=stop_token,
                    batch_size=batch_size,
                    logprobs=[sampled_logprob] if sampled_logprob is not None else None,
                    prompt_logprobs=self._take_prompt_logprobs(seq),
                )
            )
        return outputs

    # -- internals ----------------------------------------------------------------------------

    def _collect_prompt_logprobs(self, seq: Sequence, start_pos: int, logprobs: list[Logprob]) -> None:
        # Entry j scores prompt position start_pos + 1 + j. After a preemption the same
        # positions are computed again; keep only positions not collected yet.
        have = len(seq.prompt_logprobs)  # positions 1..have are collected
        for j, entry in enumerate(logprobs):
            if start_pos + 1 + j > have:
                seq.prompt_logprobs.append(entry)
                have += 1

    def _take_prompt_logprobs(self, seq: Sequence) -> list[Logprob] | None:
        if seq.sampling.prompt_logprobs is None or seq.num_output_tokens != 1:
            return None
        return seq.prompt_logprobs

    def _release_forks(self, parent_id: str) -> None:
        for child in reversed(self.forks.pop(parent_id, [])):
            self.waiting.appendleft(child)

    def _reserve_or_preempt(self, seq: Sequence, num_new: int) -> bool:
        """Make room for `num_new` more tokens of a running `seq`, preempting from the tail."""
        need = self.blocks.blocks_needed(seq.num_computed_tokens + num_new) - len(seq.block_table)
        while not self.blocks.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        seq.block_table += self.blocks.allocate(need)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _attach_cached_prefix(self, seq: Sequence) -> None:
        if seq.sampling.prompt_logprobs is not None and len(seq.prompt_logprobs) < seq.num_prompt_tokens - 1:
            return  # prompt logprobs need every prompt position computed, not served from cache
        # Keep at least one token to compute: the step must produce this request's logits.
        hits, last_hash = self.blocks.match_prefix(seq.token_ids, seq.num_tokens - 1)
        seq.block_table = hits
        seq.num_computed_tokens = len(hits) * self.config.block_size
        seq.num_hashed_blocks = len(hits)
        seq.last_block_hash = last_hash
        seq.last_block_ref = self.blocks.block_ref(hits[-1]) if hits else None
        if not seq.admitted:
            seq.num_cached_tokens = seq.num_computed_tokens

    def _release(self, seq: Sequence) -> None:
        self.blocks.free_blocks(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0
        seq.last_block_hash = None
        seq.last_block_ref = None

    def _finish(self, seq: Sequence) -> None:
        if seq.request_id in self.forks:  # its siblings go on without it
            self._release_forks(seq.request_id)
        self._release(seq)
        seq.status = SeqStatus.FINISHED
        del self.requests[seq.request_id]
        self._freed_ids.append(seq.request_id)

    def _check_finish(self, seq: Sequence, token: int) -> tuple[FinishReason | None, int | None]:
        params = seq.sampling
        if token in params.stop_token_ids:
            return FinishReason.STOP, token
        if not params.ignore_eos and token in self.config.eos_token_ids:
            return FinishReason.STOP, None
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def _make_plan(self, scheduled: list[tuple[Sequence, int]]) -> StepPlan:
        bs = self.config.block_size
        seqs = []
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            end = start + num_new
            seqs.append(
                ScheduledSeq(
                    request_id=seq.request_id,
                    token_ids=seq.token_ids[start:end],
                    start_pos=start,
                    block_table=seq.block_table[: -(-end // bs)],
                    sample=end == seq.num_tokens,
                    sampling=seq.sampling,
                    seed=seq.seed,
                    matcher=seq.matcher,
                    history=seq.token_ids if seq.sampling.has_penalties or seq.sampling.prompt_logprobs is not None else None,
                    num_prompt_tokens=seq.num_prompt_tokens,
                )
            )
        plan = StepPlan(step_id=self._next_step_id, seqs=seqs, freed_request_ids=self._freed_ids)
        self._next_step_id += 1
        self._freed_ids = []
        return plan

    # -- introspection ------------------------------------------------------------------------

    def statistics(self) -> dict[str, int]:
        return {
            "waiting": len(self.waiting) + sum(len(v) for v in self.forks.values()),
            "running": len(self.running),
            "requests": len(self.requests),
            "kv_blocks_used": self.blocks.num_used_blocks,
            "kv_blocks_free": self.blocks.num_free_blocks,
            "prefix_queries": self.blocks.num_prefix_queries,
            "prefix_hits": self.blocks.num_prefix_hits,
            "prefill_tokens": self.num_prefill_tokens,
            "preemptions": self.num_preemptions,
        }
