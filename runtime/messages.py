"""Every message that crosses an actor boundary.

Owns: the msgspec structs passed (as objects, never encoded) over trio memory channels and to the
device thread, and the `FinishReason` / `AbortReason` vocabularies. Imports msgspec only.

Batches are tuples of per-request structs. Every message names its request (or step) so the
receiving actor can bind log context per message. Every message is frozen: its builder is its
only writer (runtime/request.py has the ownership map), so a plan can cross to the device
thread while the scheduler goes on planning.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from runtime.sampling import SamplingParams


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id, or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # the engine gave up on it (shutdown, failure)


class AbortReason(str, enum.Enum):
    CLIENT_GONE = "client_gone"
    STOP_STRING = "stop_string"
    SHUTDOWN = "shutdown"
    FAILED = "failed"


class ImageFeatures(msgspec.Struct, kw_only=True, frozen=True):
    """One image of a prompt, as the vision encoder takes it: the processor's arrays for it
    (numpy, by name: pixel_values, image_grid_thw, ...), its content hash, and where its
    placeholder tokens sit in the prompt, as (start, length) runs in order (one run for
    LLaVA and Qwen2-VL; one per tile for Idefics3). The encoder's output has exactly
    `num_tokens` rows, the runs' positions in order."""

    hash: str
    runs: tuple[tuple[int, int], ...]
    arrays: dict[str, Any] = {}

    @property
    def num_tokens(self) -> int:
        return sum(length for _, length in self.runs)


class MultiModalPrompt(msgspec.Struct, kw_only=True, frozen=True):
    """What a prompt needs besides its token ids (tokenizer → scheduler → runner, once): its
    images, and for M-RoPE models (Qwen2-VL) each prompt position's (time, height, width)
    rotary positions, `[3, prompt length]` int64, and the offset every later position takes."""

    images: tuple[ImageFeatures, ...] = ()
    mrope_positions: Any = None
    mrope_delta: int = 0


class TokenizedRequest(msgspec.Struct, kw_only=True, frozen=True):
    """tokenizer → scheduler: a request ready to be scheduled."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    max_tokens: int  # resolved against the context length
    seed: int  # resolved: the request's own or one drawn for it
    arrival_time: float
    matcher: Any = None  # an llguidance matcher when sampling.guide is set (compiled off the loop)
    fork_of: str | None = None  # a sibling of this request (n > 1): admitted once that one's prompt is computed
    num_truncated_tokens: int = 0  # dropped from the front of an over-long prompt (error_behavior "truncate")
    mailbox: Any = None  # the request's DeltaMailbox; the scheduler only hands it on in RegisterRequest
    mm: MultiModalPrompt | None = None  # its images, for a vision-language model


class AbortRequest(msgspec.Struct, frozen=True):
    """anyone → scheduler (control channel): stop working on this request, free its blocks."""

    request_id: str
    reason: AbortReason


class ForkedSeq(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """A sibling (n > 1) that takes its first token from its parent's last prompt position.

    It samples from the same logits row with its own seed (and the grammar state the runner
    keeps for it), so the prompt is prefilled once for all n; the scheduler then gives it the
    parent's prompt blocks.
    """

    request_id: str
    seed: int


class Shutdown(msgspec.Struct, frozen=True):
    """runtime → scheduler: finish the step in flight, then close (shutdown in pipeline order)."""


class NewRequest(msgspec.Struct, kw_only=True, frozen=True):
    """scheduler → runner, in the first plan that schedules a request (a fork's: the plan that
    samples its first token): what the runner keeps of it until the request is freed.

    The runner owns a request's device-side state from here on (actors/runners/request_state.py):
    its token history (the prompt, then every token it sampled for it) and its grammar matcher,
    which only the device thread advances. The core hands the matcher over and keeps no
    reference to it.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    matcher: Any = None  # an llguidance matcher when sampling.guide is set
    mm: MultiModalPrompt | None = None  # its images: the runner encodes them as their tokens are fed


class ScheduledSeq(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """One request's share of a step: the tokens to feed and where its KV lives.

    `start_pos` is the position of token_ids[0]; the runner writes their keys/values into the
    slots `block_table[pos // block_size] * block_size + pos % block_size`, attends over positions
    [0, start_pos + len(token_ids)), and samples one token after the last one when `sample` is set.
    A token the core has not learned yet (sampled by the step in flight) is `PENDING_TOKEN`: the
    runner feeds the token it sampled for that position itself.
    """

    request_id: str
    token_ids: list[int]  # the plan's own copy (a slice of the core's list), never the core's
    start_pos: int
    block_table: list[int]  # the plan's own copy, as token_ids
    sample: bool
    sampling: SamplingParams
    seed: int
    num_prompt_tokens: int = 0
    forks: tuple[ForkedSeq, ...] | None = None  # siblings sampled from this seq's row (sample is set)
    # Speculative decoding: the last `num_draft_tokens` of token_ids are a draft. The runner
    # samples every one of their positions and keeps the draft while it equals what it sampled
    # (StepResult.accepted); `sampled` is then the token after the last kept one. A draft the
    # runner's draft model makes (--spec-decoding draft) is planned as `num_draft_tokens`
    # DRAFT_TOKEN placeholders: its slots, positions and blocks are the core's as for any draft,
    # its tokens the runner's (StepResult.drafted).
    num_draft_tokens: int = 0
    # Tokens the core wrote in place of sampled ones (a thinking budget's end of thinking), for a
    # request with logprobs: `forced_ids[j]` is the token at position `forced_pos + j`, which
    # the row at the position before it (one of those this seq feeds) scores. Their entries
    # come back before the sampled token's (StepResult.logprobs).
    forced_ids: tuple[int, ...] = ()
    forced_pos: int = 0


# A token id the scheduler has not learned yet because the step that samples it is in flight
# (an overlapped step's decode rows); the runner takes it from its own history.
PENDING_TOKEN = -1
# A draft token the runner's draft model proposes in the step itself (--spec-decoding draft).
DRAFT_TOKEN = -2


class StepPlan(msgspec.Struct, kw_only=True, frozen=True):
    """scheduler → executor: one packed forward. Frozen, and shares no container with the core
    (its tuples, and each seq's own list copies): the device thread reads it while the
    scheduler may already be planning the next step."""

    step_id: int
    seqs: tuple[ScheduledSeq, ...]
    new_requests: tuple[NewRequest, ...] = ()  # requests this plan schedules for the first time
    # Requests that finished or were aborted since the previous plan: the runner drops what it
    # keeps of them before this step runs.
    freed_request_ids: tuple[str, ...] = ()
    # (source, destination) KV blocks to copy before the forward: a forked sibling's private
    # copy of its parent's partly filled last prompt block (copy-on-write).
    block_copies: tuple[tuple[int, int], ...] = ()
    # Vision-language models: images the runner encodes before this step's forward, in order,
    # as (request id, image hash), ahead of the steps that feed their tokens (the scheduler
    # holds those tokens back until StepResult.images_encoded names the image), for at most
    # `encode_budget_s` seconds of encoder work (None: all of it).
    encode_ahead: tuple[tuple[str, str], ...] = ()
    encode_budget_s: float | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def num_decode_rows(self) -> int:
        """Sequences fed one token: decodes (the step cost fit's rows)."""
        return sum(1 for s in self.seqs if len(s.token_ids) == 1)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of sequences fed more than one: prompt chunks (the step cost fit's tokens)."""
        return sum(len(s.token_ids) for s in self.seqs if len(s.token_ids) > 1)


class Logprob(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A token's log-probability under the raw model distribution, with the top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []


class StepResult(msgspec.Struct, kw_only=True, frozen=True):
    """executor → scheduler: the token sampled for each `sample` seq. Built once by the runner
    (or the executor, for a failed step); its dicts are read-only after that."""

    step_id: int
    sampled: dict[str, int]
    # Per request: logprobs of the prompt tokens this step computed (when asked), then of its
    # forced tokens (ScheduledSeq.forced_ids), then of the kept draft and the sampled token
    # (when asked).
    logprobs: dict[str, list[Logprob]] = {}
    embeddings: dict[str, list[float]] = {}  # embedding models: one pooled vector per request
    # Requests that failed on their own (their grammar state broke, their sampling raised);
    # the rest of the step stands. request id -> message.
    failed: dict[str, str] = {}
    accepted: dict[str, int] = {}  # per request that drafted: how many draft tokens it kept
    # --spec-decoding draft: the draft model's tokens for each request planned with DRAFT_TOKEN
    # placeholders (the core keeps drafted[:accepted]), and the seconds its forwards past the
    # one every step runs took (its one-row draft decodes), and how many there were: the step
    # cost fit learns the step without them, the drafter what a draft forward costs.
    drafted: dict[str, list[int]] = {}
    draft_seconds: float = 0.0
    draft_forwards: int = 0
    error: str | None = None  # the whole step failed
    elapsed: float = 0.0
    # Vision-language models: the images (content hashes) whose encoder output the runner holds
    # for the requests of StepPlan.encode_ahead (or encoded in this step), and the seconds of
    # the step its vision encoder took (the step cost fit learns the rest).
    images_encoded: tuple[str, ...] = ()
    encoder_s: float = 0.0


class RegisterRequest(msgspec.Struct, kw_only=True, frozen=True):
    """scheduler core → detokenizer, on a request's first `TokenDelta`: create its decode state.

    Everything the detokenizer knows of a request besides its tokens: where its text goes,
    how to decode it, and the prompt's counts for `usage`. `num_cached_tokens` and
    `scheduled_time` are the core's own; the rest the core passes on from `TokenizedRequest`.
    """

    request_id: str
    mailbox: Any  # runtime.mailbox.DeltaMailbox
    sampling: SamplingParams
    arrival_time: float
    scheduled_time: float  # start of the first step that computed any of it
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens the prefix cache served at admission
    num_truncated_tokens: int


class TokenDelta(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """scheduler → detokenizer: new tokens of one request and whether it finished."""

    request_id: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None  # the stop_token_ids entry that ended it, if any
    batch_size: int = 0  # how many requests shared the step that produced these tokens
    queue_wait_us: int = 0  # how long the request waited for this step (MindIE's usage.queue_wait_time)
    error: str | None = None  # the step failed; finish_reason is ABORT
    logprobs: list[Logprob] | None = None  # for token_ids (sampled tokens only)
    prompt_logprobs: list[Logprob] | None = None
    embedding: list[float] | None = None
    register: RegisterRequest | None = None  # on the request's first delta only
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified in this step...
    num_accepted_tokens: int = 0  # ...and how many of them were kept (they lead token_ids)


class StepOutputs(msgspec.Struct, kw_only=True, frozen=True):
    """scheduler → detokenizer: what one step produced."""

    step_id: int
    items: list[TokenDelta]


class DropRequests(msgspec.Struct, frozen=True):
    """scheduler → detokenizer: requests it aborted; forget their decode state (if any)."""

    request_ids: list[str]


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    truncated_prompt_tokens: int = 0  # dropped by error_behavior "truncate"
    reasoning_tokens: int = 0  # of completion_tokens, those a reasoning model thought (tags included)
    # MindIE completions: per generated token, the batch size of the step that made it and the
    # microseconds the request waited in the queue for that step (arrival to first step for the
    # first token; end of its previous step to the start of this one after that).
    batch_size: list[int] = []
    queue_wait_time: list[int] = []


class TextDelta(msgspec.Struct, kw_only=True, frozen=True):
    """detokenizer → a request's mailbox. Deltas merge (into a new one) while the client is slow."""

    text: str = ""
    token_ids: list[int] = []
    logprobs: list[Logprob] | None = None
    prompt_logprobs: list[Logprob] | None = None
    embedding: list[float] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    usage: Usage | None = None
