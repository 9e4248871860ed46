"""The one place a decoded request becomes the engine's `SamplingParams` and `Prompt`.

Owns: defaults, cross-field rules (stream_options needs stream, top_logprobs needs logprobs,
...) and the table of fields we accept in the schema but cannot honour yet, each rejected
with a 400 naming it rather than silently ignored. Imports api.schemas and runtime.
"""

from __future__ import annotations

from typing import Any

from api.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from runtime.errors import InvalidRequest
from runtime.request import Prompt
from runtime.sampling import SamplingParams


def _unsupported(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{what} is not supported by this server yet.", param=param, code="unsupported_parameter")


def _stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 16:
        raise InvalidRequest("At most 16 stop sequences are allowed.", param="stop")
    if any(s == "" for s in stops):
        raise InvalidRequest("Stop sequences must not be empty.", param="stop")
    return stops


def _common(req: SamplingFields, max_tokens: int | None) -> SamplingParams:
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true.", param="stream_options")
    if req.n != 1:
        raise _unsupported("n", "n > 1")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0.0):
            raise _unsupported(name, name)
    if req.repetition_penalty not in (None, 1.0):
        raise _unsupported("repetition_penalty", "repetition_penalty")
    if req.logit_bias:
        raise _unsupported("logit_bias", "logit_bias")
    if req.min_tokens:
        raise _unsupported("min_tokens", "min_tokens")
    top_k = req.top_k if req.top_k is not None else 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if top_k == -1 else top_k,
        seed=None if req.seed is None else req.seed % (1 << 64),
        stop=_stop_tuple(req.stop),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
    )


def chat_params(req: ChatCompletionRequest) -> tuple[Prompt, SamplingParams]:
    if req.logprobs:
        raise _unsupported("logprobs", "logprobs")
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
    if req.tools:
        raise _unsupported("tools", "tools")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise _unsupported("response_format", f"response_format {req.response_format.get('type')!r}")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sampling = _common(req, max_tokens)
    messages = [_message_dict(i, m) for i, m in enumerate(req.messages)]
    kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    return Prompt(messages=messages, chat_template_kwargs=kwargs), sampling


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


def completion_params(req: CompletionRequest) -> tuple[Prompt, SamplingParams]:
    for name, value in (("echo", req.echo), ("suffix", req.suffix), ("logprobs", req.logprobs), ("use_beam_search", req.use_beam_search)):
        if value:
            raise _unsupported(name, name)
    if req.best_of not in (None, 1):
        raise _unsupported("best_of", "best_of > 1")
    if req.error_behavior != "error":
        raise _unsupported("error_behavior", "error_behavior 'truncate'")
    sampling = _common(req, req.max_tokens)
    prompts = split_prompt(req.prompt)
    if len(prompts) != 1:
        raise _unsupported("prompt", "A list of several prompts")
    prompt = prompts[0]
    if isinstance(prompt, str):
        return Prompt(text=prompt, add_special_tokens=not req.use_raw_prompt), sampling
    return Prompt(token_ids=prompt), sampling


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
