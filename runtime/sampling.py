"""Internal, already-validated generation parameters.

Owns: `SamplingParams`, the one shape every API surface is reduced to, by each OpenAI endpoint's
params.py (api/http/openai/chat/, completions/, responses/).
Actors trust it and never re-validate. Imports msgspec only.
"""

from __future__ import annotations

import msgspec


class Guide(msgspec.Struct, frozen=True, kw_only=True):
    """A constraint on what may be generated, enforced token by token on the device step.

    kind "json_schema": `definition` is a JSON Schema (text); "json_object": any JSON object;
    "lark": `definition` is a grammar in llguidance's Lark dialect (which may embed JSON
    schemas with `%json {...}`); "regex": a regular expression. Compiled and cached off the
    event loop; an invalid definition is rejected at the edge (400 naming the field).

    `prefix`: text the output must open with, fixed in advance (a forced tool call's opening).
    The tokenizer actor appends it to the prompt, so it costs one prefill instead of a decode
    step per token; the grammar constrains only what comes after it, and the output (text,
    logprobs, completion_tokens) is only what was generated: readers of the output that need
    the whole turn put `prefix` in front of it.
    """

    kind: str
    definition: str = ""
    param: str = "response_format"  # the request field an invalid definition is reported against
    prefix: str = ""


class Thinking(msgspec.Struct, frozen=True, kw_only=True):
    """A reasoning model's request that thinks: what the engine follows by token ids
    (runtime/reasoning.py `ThinkingTracker`). The detokenizer counts its reasoning tokens; with
    a `budget`, the scheduler core writes `forced_end` after the budget-th thinking token and
    the answer follows; a guide constrains only what comes after thinking ends.

    `open`: the prompt opened `<think>` (generation starts inside it); else the output opens
    it with `start_ids` first, after any whitespace (`space_ids`: the tokens whose text is
    whitespace alone, as a model that writes `\n<think>` starts), or never thinks.
    `implicit_end_ids`: tags that end thinking without the end tag (a tool call's opening),
    which are not counted as thinking."""

    open: bool
    start_ids: tuple[int, ...] = ()
    space_ids: frozenset[int] = frozenset()
    end_ids: tuple[int, ...]
    implicit_end_ids: tuple[tuple[int, ...], ...] = ()
    budget: int | None = None  # thinking tokens at most (tags included), then forced_end
    forced_end: tuple[int, ...] = ()


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """What a request asks of generation. Ranges were checked at the edge.

    `max_tokens` None means "the rest of the context", resolved by the tokenizer actor once the
    prompt length is known. `temperature` 0 means greedy. `top_k` 0 and `top_p` 1.0 mean off.
    `seed` None means the engine draws one, so a request's randomness never depends on which
    other requests share its batch.
    """

    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"  # the field the client set it with, for error messages
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    guide: Guide | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob and the top k
    prompt_logprobs: int | None = None  # the same for every prompt token after the first
    n: int = 1  # sequences generated from the prompt (best_of when more are generated than returned)
    thinking: Thinking | None = None  # a reasoning model's request that thinks (None: it does not)
    adapter: str | None = None  # the LoRA adapter the request's `model` named (runtime/adapters.py); None: the base

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def visible_tokens(tokens: list[int], sampling: SamplingParams, stopped: bool, stop_token_id: int | None) -> list[int]:
    """The tokens whose text a sequence shows (the detokenizer and beam search both apply it).

    The EOS or stop token that ended a sequence (`stopped`: its last token) is not part of its
    text, except a `stop_token_ids` hit with include_stop_str_in_output (MindIE completions: the flag only
    concerns the stops the client named, so EOS stays out either way)."""
    if stopped and tokens and not (sampling.include_stop_str_in_output and stop_token_id is not None):
        return tokens[:-1]
    return tokens
