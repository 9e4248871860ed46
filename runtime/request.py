"""What the runtime knows about one live request, shared by the actors it passes through.

Owns: `Prompt` (what to tokenize) and `RequestContext` (mailbox, parameters, timings, and the
detokenizer's per-request state). A context lives in `Runtime.requests` from submit until it
finishes or is aborted; that dict is the single registry, so "nothing leaked" means it is empty.
Imports msgspec, runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.mailbox import DeltaMailbox
from runtime.sampling import SamplingParams


class Prompt(msgspec.Struct, kw_only=True):
    """Exactly one of text, messages or token_ids."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    add_special_tokens: bool = True  # for text: let the tokenizer add BOS etc.
    truncate: bool = False  # an over-long prompt keeps its tail instead of failing (error_behavior)
    chat_template_kwargs: dict[str, Any] = {}


@dataclass(slots=True, eq=False)
class RequestContext:
    request_id: str
    prompt: Prompt
    sampling: SamplingParams
    arrival_time: float
    mailbox: DeltaMailbox = field(default_factory=DeltaMailbox)
    aborted: bool = False
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_truncated_tokens: int = 0  # dropped from the front of an over-long prompt
    num_output_tokens: int = 0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    # MindIE-style per-token usage (seed 004): the batch each token was generated in, and the
    # time (µs) the request waited in the queue for the step that made it.
    batch_sizes: list[int] = field(default_factory=list)
    queue_wait_us: list[int] = field(default_factory=list)
    # Per token, µs since the previous token reached the detokenizer ([0]: since scheduling);
    # the inter-token latency metric reads it.
    token_wait_us: list[int] = field(default_factory=list)
    last_token_time: float | None = None
    ready_time: float | None = None  # end of the step that made its latest token (scheduler)
    detok: Any = None  # actors.detok_core.IncrementalDetokenizer, created by the detokenizer
    # The other sequences of the same request (n > 1): tokenized once with this one, then
    # forked in the scheduler so they share this one's prompt blocks.
    siblings: list["RequestContext"] = field(default_factory=list)
