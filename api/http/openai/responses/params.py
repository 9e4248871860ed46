"""A decoded Responses request → the engine's `Prompt` and `SamplingParams`, its tools
(validated once) and the Response that repeats its settings.

Owns: the Responses API's cross-field rules and refusals (the Databricks Foundation Model API
makes background, store, conversation and service_tier a 400; so is previous_response_id,
since nothing is stored), text.format and tools as a guide, and the settings a Response
repeats. The counterpart of chat/params.py for this endpoint; `input` items become chat
messages in responses/input.py. Imports api.http.openai and runtime.

Log probabilities: `top_logprobs` (0-20, the Databricks reference: "the number of most likely
tokens to return at each token position") or `include: ["message.output_text.logprobs"]` asks
for them; either turns on `SamplingParams.logprobs` (with top_logprobs alternatives, 0 without
it).

`truncation: "auto"` sets `Prompt.truncate` on the message prompt: the tokenizer actor then drops
the oldest input items (never the system / instructions message, never the last item) until
the prompt and the output fit the context (actors/tokenizer.py). "disabled" (the default) makes
a prompt that does not fit a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.http.openai.common.grammars import format_guide
from api.http.openai.common.reasoning import keeps_special_tokens, thinking_params
from api.http.openai.common.sampling import NONE, check_stream_options, default
from api.http.openai.responses.input import input_messages
from api.http.openai.responses.request import ResponsesRequest
from api.http.openai.responses.response import ReasoningSettings, ResponseObject, TextSettings
from api.http.openai.tools import formats
from api.http.openai.tools.formats.base import ToolFormat
from api.http.openai.tools.parser import output_prefix
from api.http.openai.tools.spec import ToolSet
from api.http.openai.tools.validate import build_toolset
from runtime.errors import InvalidRequest
from runtime.generation_defaults import SamplingDefaults
from runtime.images import ImageRef
from runtime.reasoning import ThinkingFormat
from runtime.request import Prompt
from runtime.sampling import Guide, SamplingParams

REFUSED = {
    "background": "Background processing is not supported.",
    "store": "Stored responses are not supported.",
    "conversation": "The conversations API is not supported.",
    "service_tier": "Service tiers are not selectable on this server.",
    "previous_response_id": "Responses are not stored, so previous_response_id cannot be resolved; send the whole conversation in input.",
}
# Values of a refused field that ask for what this server does anyway: `store: false` (nothing
# is stored either way), which coding agents send on every call.
HARMLESS = {"store": False}
LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = {
    LOGPROBS,
    "reasoning.encrypted_content",  # accepted; reasoning items carry their text in the clear
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
}


@dataclass(slots=True)
class ResponsesParams:
    prompt: Prompt
    sampling: SamplingParams
    toolset: ToolSet | None  # the declared tools and tool_choice, validated; None without tools
    response: ResponseObject  # the request's settings, as the Response repeats them (unnamed yet)
    logprobs: bool = False  # output_text carries token logprobs
    images: tuple[ImageRef, ...] = ()  # the input_image parts, in order, to fetch before the prompt is opened
    fmt: ToolFormat | None = None  # the format the model writes calls in (tools/formats/)

    def output_parser(self) -> Any:
        """A fresh parser of the output (None: the output is all text)."""
        return formats.output_parser(self.fmt or formats.plain(), self.toolset, output_prefix(self.sampling))


def responses_params(
    req: ResponsesRequest, fmt: ToolFormat | None = None, takes_images: bool = False, thinking: ThinkingFormat | None = None, defaults: SamplingDefaults = NONE
) -> ResponsesParams:
    """`fmt`: the format the model writes calls in (None: Hermes, to a template that renders no
    tools); `takes_images`: a vision-language model (else input_image is a 400); `thinking`: a
    reasoning model's format (common/reasoning.py `thinking_params`)."""
    fmt = fmt or formats.plain()
    _refuse(req)
    toolset = build_toolset(req.tools, req.tool_choice, req.parallel_tool_calls, req.max_tool_calls)
    text_format = _text_format(req)
    text_guide = format_guide(text_format.get("type"), text_format.get("schema"), "text.format")
    guide: Guide | None = formats.request_guide(fmt, toolset, text_guide)
    images: list[ImageRef] = []
    messages, kwargs = fmt.render(input_messages(req.input, req.instructions, images if takes_images else None), toolset)
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
    kwargs, control = thinking_params(thinking, kwargs, effort, None, guide, "reasoning.effort")
    logprobs = req.top_logprobs is not None or LOGPROBS in (req.include or ())
    sampling = SamplingParams(
        max_tokens=req.max_output_tokens,
        max_tokens_param="max_output_tokens",
        temperature=default(req.temperature, defaults.temperature, 1.0),
        top_p=default(req.top_p, defaults.top_p, 1.0),
        top_k=defaults.top_k or 0,
        repetition_penalty=defaults.repetition_penalty or 1.0,
        guide=guide,
        logprobs=(req.top_logprobs or 0) if logprobs else None,
        thinking=control,
        skip_special_tokens=not keeps_special_tokens(fmt, thinking, control),
    )
    prompt = Prompt(messages=messages, chat_template_kwargs=kwargs, truncate=req.truncation == "auto")
    return ResponsesParams(prompt, sampling, toolset, echoed(req, toolset, text_format, sampling), logprobs, tuple(images), fmt)


def _refuse(req: ResponsesRequest) -> None:
    for name, why in REFUSED.items():
        value = getattr(req, name)
        if value is not None and not (name in HARMLESS and value is HARMLESS[name]):
            raise InvalidRequest(why, param=name, code="unsupported_parameter")
    if req.prompt is not None:
        # The Databricks reference lists `prompt` ("a reference to a prompt template and its
        # variables") among the request fields, not among the four that must be a 400. But it is only a
        # reference: {id, version, variables} names a template kept in a prompt store, and
        # this server has none (nor does it store responses or conversations), so there is
        # nothing to substitute the variables into. Generating without the template would
        # answer a different prompt than the client sent, silently; a 400 that says why is
        # the honest answer until a store exists.
        named = isinstance(req.prompt.get("id"), str)
        raise InvalidRequest(
            f"Prompt templates are kept in a prompt store, which this server does not have, so "
            f"{'prompt ' + repr(req.prompt['id']) if named else 'a prompt reference'} cannot be resolved; "
            "send the prompt's text in instructions and input.",
            param="prompt.id" if named else "prompt",
            code="unsupported_parameter",
        )
    check_stream_options(req.stream, req.stream_options)
    if req.metadata is not None:
        if len(req.metadata) > 16:
            raise InvalidRequest("metadata holds at most 16 key-value pairs.", param="metadata")
        for key, value in req.metadata.items():
            if len(key) > 64 or len(value) > 512:
                raise InvalidRequest("metadata keys are at most 64 characters and values at most 512.", param=f"metadata.{key}")
    for i, what in enumerate(req.include or []):
        if what not in INCLUDABLE:
            raise InvalidRequest(f"Unknown include value {what!r}.", param=f"include[{i}]")


def _text_format(req: ResponsesRequest) -> dict[str, Any]:
    """text.format in the SDK's flat shape; the Databricks reference's nested
    `json_schema: {...}` is accepted too."""
    fmt = dict(req.text.format) if req.text is not None and req.text.format is not None else {"type": "text"}
    if fmt.get("type") == "json_schema":
        nested = fmt.pop("json_schema", None)
        if isinstance(nested, dict):
            fmt = {**nested, **fmt}
        if "schema" not in fmt:
            raise InvalidRequest("text.format json_schema needs a schema.", param="text.format.schema")
        fmt.setdefault("name", "response")
    return fmt


def echoed(req: ResponsesRequest, toolset: ToolSet | None, text_format: dict[str, Any], sampling: SamplingParams) -> ResponseObject:
    """The Response's repeated settings (the sampling in force); the view names it (id, created_at, model)."""
    text = TextSettings(format=text_format)
    if req.text is not None and req.text.verbosity is not None:
        text.verbosity = req.text.verbosity
    reasoning = None
    if req.reasoning is not None:
        r = req.reasoning
        reasoning = ReasoningSettings(effort=r.effort, generate_summary=r.generate_summary, summary=r.summary)
        if r.encrypted_content is not None:
            reasoning.encrypted_content = r.encrypted_content
    return ResponseObject(
        id="",
        created_at=0,
        model="",
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        max_tool_calls=req.max_tool_calls,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        tools=[t.openai() for t in toolset.tools] if toolset is not None else [],
        tool_choice=toolset.choice_json() if toolset is not None else (req.tool_choice or "auto"),
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        text=text,
        reasoning=reasoning,
        metadata=req.metadata or {},
        prompt_cache_key=req.prompt_cache_key,
        prompt_cache_retention=req.prompt_cache_retention,
        safety_identifier=req.safety_identifier,
        user=req.user,
        truncation=req.truncation or "disabled",
        top_logprobs=req.top_logprobs if req.top_logprobs is not None else 0,
    )
