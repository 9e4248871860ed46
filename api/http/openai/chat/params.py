"""The one place a decoded chat request becomes the engine's `Prompt` and `SamplingParams`,
with its tools validated once (`ChatParams.toolset`, which the view reads calls back with).

Owns: Chat's cross-field rules (top_logprobs needs logprobs, the system role comes first, a
tool message names its call, ...), response_format and tools as a guide, the messages as the
chat template reads them. The rules Chat shares with Completions are common/sampling.py's.
Imports api.http.openai.common, api.http.openai.tools, api.http.openai.chat and runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from api.http.openai.chat.request import ChatCompletionRequest, ChatMessage
from api.http.openai.common.grammars import format_guide
from api.http.openai.common.images import MARKER, image_ref, text_only
from api.http.openai.common.reasoning import keeps_special_tokens, thinking_params
from api.http.openai.common.sampling import NONE, sampling_params
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
from runtime.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class ChatParams:
    prompt: Prompt
    sampling: SamplingParams
    toolset: ToolSet | None  # the declared tools and tool_choice, validated; None without tools
    images: tuple[ImageRef, ...] = ()  # the image parts, in order, to fetch before the prompt is opened
    fmt: ToolFormat | None = None  # the format the model writes calls in (tools/formats/)

    def output_parser(self) -> Any:
        """A fresh parser of one choice's output (None: the output is all text)."""
        return formats.output_parser(self.fmt or formats.plain(), self.toolset, output_prefix(self.sampling))

    @property
    def thinks(self) -> bool:
        """The format splits reasoning out of the output itself (harmony)."""
        return bool(getattr(self.fmt, "thinks", False))


def chat_params(req: ChatCompletionRequest, fmt: ToolFormat | None = None, thinking: ThinkingFormat | None = None) -> tuple[Prompt, SamplingParams]:
    """What the engine runs for a chat request (the cluster's ingress hashes its prompt)."""
    params = chat_request(req, fmt, thinking=thinking)
    return params.prompt, params.sampling


def chat_request(
    req: ChatCompletionRequest, fmt: ToolFormat | None = None, takes_images: bool = False, thinking: ThinkingFormat | None = None, defaults: SamplingDefaults = NONE
) -> ChatParams:
    """`fmt`: the format the model writes calls in (tools/formats/; None: Hermes, to a template
    that renders no tools); `takes_images`: a vision-language model (else image parts are a
    400); `thinking`: a reasoning model's format (common/reasoning.py `thinking_params`)."""
    fmt = fmt or formats.plain()
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
    toolset = build_toolset(req.tools, req.tool_choice, req.parallel_tool_calls)
    text_guide = _response_format_guide(req.response_format)
    guide = formats.request_guide(fmt, toolset, text_guide)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    sampling = sampling_params(req, max_tokens, n_generate=req.n, logprobs=logprobs, defaults=defaults)
    if guide is not None:
        sampling = msgspec.structs.replace(sampling, guide=guide)
    if req.max_completion_tokens is not None:  # it wins over max_tokens: errors name it
        sampling = msgspec.structs.replace(sampling, max_tokens_param="max_completion_tokens")
    _check_roles(req.messages)
    images: list[ImageRef] = []
    messages = [_message_dict(i, m, images if takes_images else None) for i, m in enumerate(req.messages)]
    messages, tool_kwargs = fmt.render(messages, toolset)
    kwargs: dict[str, Any] = {**(req.chat_template_kwargs or {}), **tool_kwargs}
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    kwargs, control = thinking_params(thinking, kwargs, req.reasoning_effort, req.chat_template_kwargs, guide, "reasoning_effort")
    if control is not None:
        sampling = msgspec.structs.replace(sampling, thinking=control)
    if keeps_special_tokens(fmt, thinking, control):
        sampling = msgspec.structs.replace(sampling, skip_special_tokens=False)
    return ChatParams(Prompt(messages=messages, chat_template_kwargs=kwargs), sampling, toolset, tuple(images), fmt)


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
    """The Databricks Foundation Model API's chat request: the system role "may be used only
    once, as the first message" (a developer message is the same system prompt under OpenAI's
    newer name), and a tool message carries the tool_call_id of the call it answers."""
    for i, message in enumerate(messages):
        if message.role in ("system", "developer") and i > 0:
            raise InvalidRequest(
                f"A {message.role} message may appear only once, as the first message; messages[{i}] is a {message.role} message.",
                param=f"messages[{i}].role",
            )
        if message.role == "tool" and not message.tool_call_id:
            raise InvalidRequest("A tool message needs the tool_call_id of the call it answers.", param=f"messages[{i}].tool_call_id")


def _message_dict(index: int, message: ChatMessage, images: list[ImageRef] | None) -> dict[str, Any]:
    """`images`: where a vision-language model's image parts go (None: the model reads text only)."""
    out: dict[str, Any] = {"role": message.role}
    content: Any = message.content
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            param = f"messages[{index}].content[{j}]"
            if part.type in ("text", "input_text", "output_text") and part.text is not None:
                parts.append({"type": "text", "text": part.text})
            elif part.type in ("image_url", "input_image") and images is not None:
                if message.role != "user":
                    raise InvalidRequest("Images go in user messages.", param=f"{param}.type")
                images.append(image_ref(part.image_url, part.detail, f"{param}.image_url"))
                parts.append(MARKER)
            elif part.type in ("image_url", "input_image", "input_audio", "file", "input_file"):
                raise text_only(part.type, f"{param}.type")
            else:
                raise InvalidRequest(f"Unknown content part type {part.type!r}.", param=f"{param}.type")
        # Text alone stays one string (every chat template reads that); with images, the parts.
        content = parts if MARKER in parts else "".join(p["text"] for p in parts)
    if content is None and not message.tool_calls:
        raise InvalidRequest("A message needs content.", param=f"messages[{index}].content")
    out["content"] = content or ""
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    reasoning = message.reasoning if message.reasoning is not None else message.reasoning_content
    if message.role == "assistant" and reasoning:  # the template renders it or drops it, as the model was trained
        out["reasoning_content"] = reasoning
    return out
