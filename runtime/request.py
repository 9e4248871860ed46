"""Per-request state, and which actor writes each field of it.

Owns: `Prompt` (what to tokenize), `RequestContext` (the engine's record of a live request,
which is also what the tokenizer is sent) and `DecodeState` (the detokenizer's). The scheduler
core's record is `actors.sequence.Sequence`, the runner's `actors.runners.request_state.RequestState`.
Each field has exactly one writer; the other actors learn of it only through the typed, frozen
messages in runtime/messages.py. The table in the comment below the imports names each field's
owner; tests/unit/test_ownership.py reads it and fails when code outside a field's owner writes
it, or when a field is missing from the table. Imports msgspec, runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.images import ImageInput
from runtime.mailbox import DeltaMailbox
from runtime.messages import RegisterRequest
from runtime.sampling import SamplingParams

# Owners (each owner is one actor; these are its modules):
#
#     edge         api/
#     engine       actors/engine.py
#     core         actors/sched_core.py actors/plans.py actors/lookahead.py actors/drafting.py actors/blocks.py actors/sequence.py actors/embed_core.py
#     runner       actors/runners/
#     detokenizer  actors/detokenizer.py
#
# The tokenizer and the scheduler shell (actors/scheduler.py) keep no per-request state: the
# tokenizer reads a `RequestContext` and sends a `TokenizedRequest`; the shell passes messages
# between the core and the other actors. The runner runs on the device thread: what it keeps of
# a request (its token history and grammar matcher) comes once in the plan's `NewRequest` and
# goes when a plan lists the request in `freed_request_ids`; nothing it writes is the core's.
#
# Field                                Owner        How the others learn of it
#     Prompt.text                      edge         RequestContext.prompt (built once, never written)
#     Prompt.messages                  edge         RequestContext.prompt
#     Prompt.token_ids                 edge         RequestContext.prompt
#     Prompt.add_special_tokens        edge         RequestContext.prompt
#     Prompt.truncate                  edge         RequestContext.prompt
#     Prompt.chat_template_kwargs      edge         RequestContext.prompt
#     Prompt.images                    edge         RequestContext.prompt (decoded at the edge; the tokenizer's processor reads them)
#     RequestContext.request_id        engine       every message names it
#     RequestContext.prompt            engine       read by the tokenizer (and the edge, for echo)
#     RequestContext.sampling          engine       TokenizedRequest.sampling
#     RequestContext.arrival_time      engine       TokenizedRequest.arrival_time
#     RequestContext.mailbox           engine       TokenizedRequest.mailbox -> RegisterRequest.mailbox
#     RequestContext.siblings          engine       read by the tokenizer: one TokenizedRequest each (fork_of)
#     RequestContext.aborted           engine       read by the tokenizer; AbortRequest to the scheduler
#     Sequence.request_id              core         ScheduledSeq / TokenDelta
#     Sequence.token_ids               core         ScheduledSeq.token_ids; NewRequest.prompt_token_ids; TokenDelta.token_ids
#     Sequence.num_prompt_tokens       core         RegisterRequest.num_prompt_tokens (len of TokenizedRequest.prompt_token_ids)
#     Sequence.sampling                core         ScheduledSeq.sampling
#     Sequence.max_tokens              core         (core only; from TokenizedRequest)
#     Sequence.seed                    core         ScheduledSeq.seed
#     Sequence.arrival_time            core         RegisterRequest.arrival_time
#     Sequence.status                  core         (core only)
#     Sequence.num_computed_tokens     core         ScheduledSeq.start_pos
#     Sequence.block_table             core         ScheduledSeq.block_table
#     Sequence.num_hashed_blocks       core         (core only: the block manager's prefix hashing)
#     Sequence.last_block_hash         core         (core only)
#     Sequence.last_block_ref          core         (core only)
#     Sequence.num_cached_tokens       core         RegisterRequest.num_cached_tokens -> usage.cached_tokens
#     Sequence.num_truncated_tokens    core         RegisterRequest.num_truncated_tokens (the tokenizer's count, in TokenizedRequest)
#     Sequence.num_preemptions         core         (core only)
#     Sequence.admitted                core         (core only)
#     Sequence.introduced              core         (core only: NewRequest sent)
#     Sequence.matcher                 core         NewRequest.matcher (handed to the runner once, then None here)
#     Sequence.thinking                core         (core only: a thinking budget; the tokens it forces go out as any token does, with logprobs once scored: Sequence.held)
#     Sequence.held                    core         ScheduledSeq.forced_ids / forced_pos; TokenDelta.token_ids and logprobs once scored
#     Sequence.prompt_logprobs         core         TokenDelta.prompt_logprobs
#     Sequence.mailbox                 core         RegisterRequest.mailbox (held, never used)
#     Sequence.registered              core         (core only: RegisterRequest sent)
#     Sequence.scheduled_time          core         RegisterRequest.scheduled_time
#     Sequence.ready_time              core         TokenDelta.queue_wait_us
#     Sequence.mm                      core         NewRequest.mm (handed to the runner once, then None here)
#     Sequence.prompt_keys             core         (core only: the prompt as the prefix cache hashes it, images' hashes in their tokens)
#     RequestState.history             runner       (runner only: prompt from NewRequest, then the tokens it samples)
#     RequestState.num_prompt_tokens   runner       (runner only; from NewRequest)
#     RequestState.matcher             runner       (runner only; from NewRequest, advanced by each sampled token)
#     RequestState.mm                  runner       (runner only; from NewRequest: the prompt's images for the encoder, M-RoPE positions)
#     RequestState.thinking            runner       (runner only: where a thinking request's grammar starts)
#     RequestState.grammar_from        runner       (runner only)
#     RequestState.tracked             runner       (runner only)
#     RequestState.array               runner       (runner only: the history as int64, which penalties read)
#     RequestState.synced              runner       (runner only: how much of it is the history's)
#     DecodeState.start                detokenizer  (the RegisterRequest it was created from)
#     DecodeState.detok                detokenizer  on_finish hooks, after it finished
#     DecodeState.num_output_tokens    detokenizer  Usage.completion_tokens
#     DecodeState.thinking             detokenizer  Usage.reasoning_tokens (its ThinkingTracker's count)
#     DecodeState.first_token_time     detokenizer  on_finish hooks (metrics)
#     DecodeState.last_token_time      detokenizer  (detokenizer only)
#     DecodeState.batch_sizes          detokenizer  Usage.batch_size
#     DecodeState.queue_wait_us        detokenizer  Usage.queue_wait_time
#     DecodeState.token_wait_us        detokenizer  on_finish hooks (metrics)
#     DecodeState.num_draft_tokens     detokenizer  the request_finished log line (TokenDelta.num_draft_tokens summed)
#     DecodeState.num_accepted_tokens  detokenizer  the request_finished log line (TokenDelta.num_accepted_tokens summed)
#
# Life cycle: the engine creates a `RequestContext` in `open()` and keeps it in
# `Engine.requests` (its own dict: only the engine adds or removes entries) until the request
# is aborted or the detokenizer reports it done (`DetokenizerActor.on_done`). The core creates a
# `Sequence` on `TokenizedRequest` and deletes it at finish or `AbortRequest`. The runner creates
# a `RequestState` on the request's `NewRequest` and deletes it when a plan frees the request.
# The detokenizer creates a `DecodeState` on a delta's `RegisterRequest` and deletes it at
# finish, at failure, or on `DropRequests`. `DeltaMailbox` is a channel, not a field: the
# detokenizer puts deltas in it, and whoever ends a request early (tokenizer, engine,
# detokenizer) fails it.


class Prompt(msgspec.Struct, kw_only=True):
    """Exactly one of text, messages or token_ids."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    add_special_tokens: bool = True  # for text: let the tokenizer add BOS etc.
    truncate: bool = False  # an over-long prompt keeps its tail instead of failing (error_behavior)
    chat_template_kwargs: dict[str, Any] = {}
    # Decoded images (runtime/images.py), in the order their parts appear in `messages`; only
    # for a model that reads images (the edge refuses them otherwise).
    images: tuple[ImageInput, ...] = ()


@dataclass(slots=True, eq=False)
class RequestContext:
    """The engine's record of a live request; the tokenizer's inbox carries it."""

    request_id: str
    prompt: Prompt
    sampling: SamplingParams
    arrival_time: float
    mailbox: DeltaMailbox = field(default_factory=DeltaMailbox)
    aborted: bool = False
    # The other sequences of the same request (n > 1): tokenized once with this one, then
    # forked in the scheduler so they share this one's prompt blocks.
    siblings: list["RequestContext"] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class DecodeState:
    """The detokenizer's record of a request it is decoding (created on `RegisterRequest`)."""

    start: RegisterRequest
    detok: Any = None  # actors.detok_core.IncrementalDetokenizer, made with the first tokens
    num_output_tokens: int = 0
    thinking: Any = None  # runtime.reasoning.ThinkingTracker when the request thinks (sampling.thinking)
    first_token_time: float | None = None
    last_token_time: float | None = None
    # MindIE completions' per-token usage: the batch each token was generated in, and the
    # time (µs) the request waited in the queue for the step that made it.
    batch_sizes: list[int] = field(default_factory=list)
    queue_wait_us: list[int] = field(default_factory=list)
    # Per token, µs since the previous token reached the detokenizer ([0]: since scheduling);
    # the inter-token latency metric reads it.
    token_wait_us: list[int] = field(default_factory=list)
    # Speculative decoding: draft tokens verified for it, and kept (its finish log line says).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.start.request_id
