"""The one place a decoded request becomes the engine's `SamplingParams` and `Prompt`.

Owns: defaults, cross-field rules (stream_options needs stream, top_logprobs needs logprobs,
...) and the table of fields we accept in the schema but cannot honour yet, each rejected
with a 400 naming it rather than silently ignored. Imports api.http.openai.schemas and runtime.
"""

from __future__ import annotations

from typing import Any

import msgspec

from api.http.openai.grammars import format_guide
from api.http.openai.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from api.http.openai.tools.grammar import tool_guide
from api.http.openai.tools.prompt import render_conversation
from api.http.openai.tools.spec import ToolSet
from api.http.openai.tools.validate import build_toolset
from runtime.errors import InvalidRequest
from runtime.request import Prompt
from runtime.sampling import SamplingParams


def _unsupported(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{what} is not supported by this server yet.", param=param, code="unsupported_parameter")


# Seed 004: a stop string has 1 to 32768 characters; a list's strings are non-empty and hold at
# most 32768 characters together (an empty list is null). No seed limits how many there are.
STOP_MAX_CHARS = 32 * 1024


# Seed 004: a completion's seed is a uint64 in (0, 18446744073709551615]; Chat's is OpenAI's
# int64 (seed 003 sets no range), checked in _common.
SEED_MAX = 2**64 - 1


def _stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(s == "" for s in stops):
        raise InvalidRequest("Stop sequences must not be empty.", param="stop")
    if sum(len(s) for s in stops) > STOP_MAX_CHARS:
        raise InvalidRequest(f"Stop sequences may hold at most {STOP_MAX_CHARS} characters in all.", param="stop")
    return stops


def check_stream_options(stream: bool, stream_options: object) -> None:
    """stream_options only with stream: the rule of every endpoint that streams."""
    if stream_options is not None and not stream:
        raise InvalidRequest("stream_options is only allowed when stream is true.", param="stream_options")


def _common(
    req: SamplingFields, max_tokens: int | None, *, n_generate: int, logprobs: int | None, beam: bool = False
) -> SamplingParams:
    """Every rule Chat, Completions and beam search share; `beam`: deterministic beam search,
    where n > 1 needs no temperature."""
    check_stream_options(req.stream, req.stream_options)
    if not beam and req.n > 1 and req.temperature == 0.0:
        raise InvalidRequest("n > 1 needs temperature > 0 (greedy sampling would repeat one answer n times).", param="temperature")
    if req.top_k == 0:
        # Seeds 000/001: null or an integer > 0; seed 004: -1 or (0, 2147483647]. 0 is neither.
        raise InvalidRequest("top_k must be -1 or null (off), or greater than 0.", param="top_k")
    if req.logit_bias:
        raise _unsupported("logit_bias", "logit_bias")
    if req.min_tokens:
        raise _unsupported("min_tokens", "min_tokens")
    if req.seed is not None and not -(2**63) <= req.seed <= 2**64 - 1:
        raise InvalidRequest("seed must fit in 64 bits.", param="seed", code="invalid_value")
    top_k = req.top_k if req.top_k is not None else 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if top_k == -1 else top_k,
        seed=None if req.seed is None else req.seed % (1 << 63),
        stop=_stop_tuple(req.stop),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logprobs=logprobs,
        n=n_generate,
    )


def chat_params(req: ChatCompletionRequest, template_tools: bool = False) -> tuple[Prompt, SamplingParams]:
    """`template_tools`: the model's chat template renders `tools` (see api/tools.py)."""
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
    toolset = chat_tools(req)
    text_guide = _response_format_guide(req.response_format)
    guide = tool_guide(toolset, text_guide) if toolset is not None else text_guide
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    sampling = _common(req, max_tokens, n_generate=req.n, logprobs=logprobs)
    if guide is not None:
        sampling = msgspec.structs.replace(sampling, guide=guide)
    if req.max_completion_tokens is not None:  # it wins over max_tokens: errors name it
        sampling = msgspec.structs.replace(sampling, max_tokens_param="max_completion_tokens")
    _check_roles(req.messages)
    messages = [_message_dict(i, m) for i, m in enumerate(req.messages)]
    messages, tool_kwargs = render_conversation(messages, toolset, template_tools)
    kwargs: dict[str, Any] = {**(req.chat_template_kwargs or {}), **tool_kwargs}
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    return Prompt(messages=messages, chat_template_kwargs=kwargs), sampling


def chat_tools(req: ChatCompletionRequest) -> ToolSet | None:
    """The request's tools and tool_choice, validated; None when it has no tools."""
    return build_toolset(req.tools, req.tool_choice, req.parallel_tool_calls)


def _response_format_guide(response_format: dict[str, Any] | None) -> Any:
    """response_format → a Guide: json_object, or json_schema ({"json_schema": {"schema": ...}})."""
    if not response_format:
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if response_format.get("type") == "json_schema" and schema is None:
        raise InvalidRequest("response_format json_schema needs json_schema.schema.", param="response_format.json_schema.schema")
    return format_guide(response_format.get("type", "text"), schema, "response_format", "response_format.json_schema.schema")


def _check_roles(messages: list[ChatMessage]) -> None:
    """Seeds 000-002: the system role "may be used only once, as the first message" (a
    developer message is the same system prompt under OpenAI's newer name); seed 001: a tool
    message carries the tool_call_id of the call it answers."""
    for i, message in enumerate(messages):
        if message.role in ("system", "developer") and i > 0:
            raise InvalidRequest(
                f"A {message.role} message may appear only once, as the first message; messages[{i}] is a {message.role} message.",
                param=f"messages[{i}].role",
            )
        if message.role == "tool" and not message.tool_call_id:
            raise InvalidRequest("A tool message needs the tool_call_id of the call it answers.", param=f"messages[{i}].tool_call_id")


def _message_dict(index: int, message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role}
    content = message.content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.type in ("text", "input_text", "output_text") and part.text is not None:
                texts.append(part.text)
            elif part.type in ("image_url", "input_image", "input_audio", "file", "input_file"):
                raise InvalidRequest(
                    f"Content parts of type {part.type!r} need a multimodal model; this model reads text only.",
                    param=f"messages[{index}].content[{j}].type",
                )
            else:
                raise InvalidRequest(f"Unknown content part type {part.type!r}.", param=f"messages[{index}].content[{j}].type")
        content = "".join(texts)
    if content is None and not message.tool_calls:
        raise InvalidRequest("A message needs content.", param=f"messages[{index}].content")
    out["content"] = content or ""
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def completion_params(req: CompletionRequest) -> tuple[list[Prompt], SamplingParams]:
    """Prompts (one per prompt in a batch) and the parameters each of their sequences uses.

    `sampling.n` is how many sequences run per prompt: best_of when given (the route returns
    the n best by cumulative logprob), else n. use_beam_search goes to `_beam_params`.
    """
    if req.seed is not None and not 0 < req.seed <= SEED_MAX:
        raise InvalidRequest(f"seed must be in (0, {SEED_MAX}] (seed 004); got {req.seed}.", param="seed", code="invalid_value")
    if req.use_beam_search:
        return _beam_params(req)
    best_of = req.best_of if req.best_of is not None else req.n
    if best_of < req.n:
        raise InvalidRequest(f"best_of ({best_of}) must be at least n ({req.n}).", param="best_of")
    if req.stream and best_of != req.n:
        raise InvalidRequest("Streaming needs best_of equal to n: the best sequences are only known at the end.", param="best_of")
    if best_of > 1 and req.temperature == 0.0:
        raise InvalidRequest("best_of > 1 needs temperature > 0.", param="temperature")
    # Ranking by cumulative logprob needs the sampled tokens' logprobs even when the client did
    # not ask for them; the route strips what it was not asked for.
    logprobs = req.logprobs if req.logprobs is not None else (0 if best_of > req.n else None)
    sampling = _common(req, req.max_tokens, n_generate=best_of, logprobs=logprobs)
    if req.echo and req.logprobs is not None:
        sampling = msgspec.structs.replace(sampling, prompt_logprobs=req.logprobs)
    return _prompts(req), sampling


def _beam_params(req: CompletionRequest) -> tuple[list[Prompt], SamplingParams]:
    """Beam search (seed 004): width = max(best_of, n), returns n, ranked by score.

    The shared rules apply (`_common`), and every control is honoured by api/beam.py
    (stop_token_ids, ignore_eos, the penalties, logprobs, echo, suffix, error_behavior) except
    these, rejected naming the field: `stop`, which seed 004 says beam search does not take;
    top_p / top_k other than off, which restrict sampling and a deterministic search does not
    sample. temperature and seed are accepted (seed 004's own beam example sends temperature 1)
    and have nothing to act on, as in transformers' generate(num_beams=k, do_sample=False).
    best_of is not checked against n here, as the seed says. `sampling.n` carries the width.
    """
    if req.stop:
        raise InvalidRequest("use_beam_search cannot be combined with stop (seed 004).", param="stop")
    if req.top_p is not None and req.top_p != 1.0:
        raise InvalidRequest("top_p does not apply to beam search, which does not sample.", param="top_p")
    if req.top_k is not None and req.top_k > 0:
        raise InvalidRequest("top_k does not apply to beam search, which does not sample.", param="top_k")
    width = max(req.n, req.best_of or 1)
    sampling = _common(req, req.max_tokens, n_generate=width, logprobs=req.logprobs, beam=True)
    sampling = msgspec.structs.replace(sampling, temperature=0.0, top_p=1.0, top_k=0, seed=None)
    if req.echo and req.logprobs is not None:
        sampling = msgspec.structs.replace(sampling, prompt_logprobs=req.logprobs)
    return _prompts(req), sampling


def _prompts(req: CompletionRequest) -> list[Prompt]:
    truncate = req.error_behavior == "truncate"
    return [
        Prompt(text=p, add_special_tokens=not req.use_raw_prompt, truncate=truncate)
        if isinstance(p, str)
        else Prompt(token_ids=p, truncate=truncate)
        for p in split_prompt(req.prompt)
    ]


def split_prompt(prompt: str | list[Any]) -> list[str | list[int]]:
    """A Completions `prompt` as a list of prompts, each text or token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequest("The prompt is empty.", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        for i, ids in enumerate(prompt):
            if not ids:
                raise InvalidRequest("A token-id prompt is empty.", param=f"prompt[{i}]")
        return [list(p) for p in prompt]
    raise InvalidRequest("prompt must be a string, a list of strings, a list of token ids or a list of such lists.", param="prompt")
