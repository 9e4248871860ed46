"""One request as the scheduler core sees it. Pure: no torch, no trio.

Owns: `Sequence` (a request's tokens, progress, blocks and the counts the core reports),
`SeqStatus` and `SchedulerConfig`. Only the scheduler core (actors/sched_core.py,
actors/blocks.py) writes a `Sequence`; what others need of it leaves in messages: the block
table and tokens in `ScheduledSeq`, the prompt and the grammar matcher once in `NewRequest`
(the runner keeps its own history and advances the matcher from then on), new tokens in
`TokenDelta`, and once per request the `RegisterRequest` that carries the core's cached-token
count to the detokenizer.

Tokens a thinking budget forces were never sampled: for a request with logprobs they are held
(`Held`) until the step that feeds them has scored each from the row before it (`ScheduledSeq.
forced_ids`), then go out with their entries, ahead of the token sampled after them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from runtime.adapters import salt
from runtime.messages import FinishReason, Logprob, RegisterRequest, ScheduledSeq, TokenizedRequest
from runtime.prefix_hash import keyed_token_ids
from runtime.reasoning import ThinkingTracker
from runtime.sampling import SamplingParams


@dataclass(slots=True)
class Held:
    """Forced tokens at the end of a request's tokens, from position `first`, not yet sent:
    their logprobs as scored so far (in order), and the finish reached inside them (max_tokens
    or the context), which ends the request once they are scored."""

    first: int
    logprobs: list[Logprob] = field(default_factory=list)
    finish: FinishReason | None = None


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
    num_truncated_tokens: int = 0  # the tokenizer's count, passed on in RegisterRequest
    num_preemptions: int = 0
    admitted: bool = False
    introduced: bool = False  # the runner has had its NewRequest (and with it the matcher)
    matcher: Any = None  # the grammar matcher until it is handed to the runner, then None
    # runtime.reasoning.ThinkingTracker when the request thinks within a budget: past it, the
    # core writes the end-of-thinking sequence itself (SchedulerCore._append_token).
    thinking: Any = None
    held: Held | None = None  # forced tokens awaiting their logprobs (a request with logprobs)
    prompt_logprobs: list[Logprob] = field(default_factory=list)  # collected, delivered with the first token
    mailbox: Any = None  # opaque here: handed to the detokenizer in RegisterRequest
    registered: bool = False  # its RegisterRequest went out (on its first TokenDelta)
    scheduled_time: float | None = None  # start of the first step that computed any of it
    ready_time: float | None = None  # end of the step that made its latest token
    # A prompt with images: its token ids with each image's tokens keyed by the image's hash
    # (runtime/prefix_hash.py), what its KV blocks are hashed by; None: the token ids themselves.
    prompt_keys: list[int] | None = None
    mm: Any = None  # runtime.messages.MultiModalPrompt until handed to the runner (NewRequest), then None

    @property
    def prefix_root(self) -> int | None:
        """Where its prefix-cache chain starts: its LoRA adapter's salt (None: the base model)."""
        return salt(self.sampling.adapter)

    @classmethod
    def of(cls, request: TokenizedRequest) -> Sequence:
        return cls(
            request_id=request.request_id,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            sampling=request.sampling,
            max_tokens=request.max_tokens,
            seed=request.seed,
            arrival_time=request.arrival_time,
            matcher=request.matcher,
            thinking=ThinkingTracker(request.sampling.thinking) if request.sampling.thinking is not None and request.sampling.thinking.budget is not None else None,
            num_truncated_tokens=request.num_truncated_tokens,
            mailbox=request.mailbox,
            prompt_keys=keyed_token_ids(request.prompt_token_ids, request.mm) if request.mm is not None and request.mm.images else None,
            mm=request.mm,
        )

    @property
    def all_token_ids(self) -> list[int]:
        """The tokens as the prefix cache hashes them (images keyed by their hashes)."""
        if self.prompt_keys is None:
            return self.token_ids
        return self.prompt_keys + self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def queue_wait_us(self, started: float, finished: float) -> int:
        """How long it waited for the step (started..finished) that made its next token: since
        arrival until its first step for the first token, since the end of its previous
        token's step after that (MindIE's usage.queue_wait_time)."""
        if self.ready_time is None:
            if self.scheduled_time is None:  # a forked sibling: first computed in this step
                self.scheduled_time = started
            wait = self.scheduled_time - self.arrival_time
        else:
            wait = started - self.ready_time
        self.ready_time = finished
        return max(0, int(wait * 1e6))

    def finish_reason(self, token: int, eos_token_ids: frozenset[int], max_model_len: int) -> tuple[FinishReason | None, int | None]:
        """Whether `token`, just appended, ends the request: (why, the stop token id that did)."""
        params = self.sampling
        if token in params.stop_token_ids:
            return FinishReason.STOP, token
        if not params.ignore_eos and token in eos_token_ids:
            return FinishReason.STOP, None
        if self.num_output_tokens >= self.max_tokens or self.num_tokens >= max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def think(self, token: int, taken: list[int], max_model_len: int) -> FinishReason | None:
        """Follow a budgeted request's thinking over `token`, just appended; at the budget,
        append the end-of-thinking sequence after it (to `taken` too: the step's output). The
        next step feeds it, and the runner takes it into its history. Returns LENGTH when
        max_tokens or the context ends inside it.

        A request with logprobs holds the forced tokens instead (`held`): the step that feeds
        them scores them, and they go out then, a finish inside them with them."""
        tracker = self.thinking
        tracker.push(token)
        if not tracker.over_budget():
            return None
        assert self.sampling.thinking is not None
        if self.sampling.logprobs is not None:
            self.held = Held(first=self.num_tokens)
        for forced in self.sampling.thinking.forced_end:
            self.token_ids.append(forced)
            if self.held is None:
                taken.append(forced)
            tracker.push(forced)
            finish, _ = self.finish_reason(forced, frozenset(), max_model_len)
            if finish is not None and self.held is not None:
                self.held.finish = finish  # it runs one more step, which scores them
                return None
            if finish is not None:
                return finish
        return None

    def forced_to_score(self, start: int, end: int) -> tuple[int, tuple[int, ...]]:
        """Of the held tokens not scored yet, those a row feeding positions [start, end) scores
        (position q from the row at q - 1): (the first one's position, their ids)."""
        held = self.held
        if held is None:
            return 0, ()
        first = max(held.first + len(held.logprobs), start + 1)
        return first, tuple(self.token_ids[first : min(self.num_tokens, end + 1)])

    def score_forced(self, item: ScheduledSeq, logprobs: list[Logprob] | None) -> list[Logprob] | None:
        """Take a step's entries for the held tokens it scored (`item.forced_ids`, the last of
        what is left of its entries once the new tokens' are taken); those scored already (the
        same rows computed again after a preemption) are skipped. The rest: prompt logprobs."""
        held, n = self.held, len(item.forced_ids)
        if not logprobs or not n:
            return logprobs
        for offset, entry in enumerate(logprobs[-n:]):
            if held is not None and item.forced_pos + offset == held.first + len(held.logprobs):
                held.logprobs.append(entry)
        return logprobs[:-n]

    def release_held(self, logprobs: list[Logprob] | None) -> tuple[list[int], list[Logprob] | None, FinishReason | None]:
        """The held tokens, scored by the step that fed them and sampled after them: they go out
        first, their entries before `logprobs` (the new tokens'), with the finish reached
        inside them (the token sampled after such a finish is dropped)."""
        held, self.held = self.held, None
        if held is None:
            return [], logprobs, None
        return self.token_ids[held.first :], held.logprobs + (logprobs or []), held.finish

    def cache_limit(self) -> int:
        """How many of its tokens the prefix cache may serve: all but the last (a step must
        produce its logits), and none from the row that scores a held token not scored yet."""
        limit = self.num_tokens - 1
        if self.held is not None:
            limit = min(limit, self.held.first + len(self.held.logprobs) - 1)
        return limit

    def collect_prompt_logprobs(self, start_pos: int, logprobs: list[Logprob]) -> None:
        # Entry j scores prompt position start_pos + 1 + j. After a preemption the same
        # positions are computed again; keep only positions not collected yet.
        have = len(self.prompt_logprobs)  # positions 1..have are collected
        for j, entry in enumerate(logprobs):
            if start_pos + 1 + j > have:
                self.prompt_logprobs.append(entry)
                have += 1

    def take_prompt_logprobs(self) -> list[Logprob] | None:
        """The prompt's logprobs, with the first token (when asked)."""
        if self.sampling.prompt_logprobs is None or self.num_output_tokens != 1:
            return None
        return self.prompt_logprobs

    def take_register(self, now: float) -> RegisterRequest | None:
        """The detokenizer's registration, the first time it is asked for; None after."""
        if self.registered:
            return None
        self.registered = True
        return RegisterRequest(
            request_id=self.request_id,
            mailbox=self.mailbox,
            sampling=self.sampling,
            arrival_time=self.arrival_time,
            scheduled_time=self.scheduled_time if self.scheduled_time is not None else now,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
            num_truncated_tokens=self.num_truncated_tokens,
        )


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 512
    max_model_len: int = 8192
    # With requests streaming, a step may carry prompt tokens worth at most (step_stretch - 1)
    # x its decodes' own time, as measured by actors/step_cost.py. None: the token budget only.
    step_stretch: float | None = None
    step_samples: tuple[tuple[int, int, float], ...] = ()  # the runner's timed start-up steps, to seed it
    # With requests streaming, the most prompt chunks a step carries (None: any). A runner
    # whose steps with one chunk beside the decodes run compiled and those with two eager
    # asks for 1 (ModelInfo.prompt_chunks): a two-chunk step cost 1.3-1.5x a one-chunk step
    # of the same tokens there (ops/results/step-ab-two-chunks-vs-one-2026-11-27-xeon-amx.json).
    max_prompt_chunks: int | None = None
    # A burst: two or more prompts waiting to start, at least BURST_RATIO per stream. Then one
    # step starts them all, up to this many tokens (each chunk still at most
    # max_num_batched_tokens), as if nobody streamed; 0: no bursts (step_cost.py `is_burst`).
    burst_tokens: int = 0
    num_spec_tokens: int = 0  # speculative decoding: the most draft tokens a request verifies in a step (0: off)
    draft_model: bool = False  # drafts come from the runner's draft model (actors/model_drafts.py), not n-grams
    spec_max_rows: int | None = None  # no drafts in a step of more decode rows than this (None: the fit decides alone)
    eos_token_ids: frozenset[int] = frozenset()
    max_adapters: int = 0  # LoRA adapters running at once (--max-loras: the runner's slots); 0: no adapters
