"""A decoded Responses request → the engine's `Prompt` and `SamplingParams` (+ its tools).

Owns: the Responses API's cross-field rules and refusals (seed 001: background, store,
conversation and service_tier are a 400; so is previous_response_id, since nothing is
stored), turning `input` items into chat messages, and the settings a Response echoes.
The counterpart of `api/params.py` for this endpoint. Imports api and runtime.

Inputs the model cannot read are refused with a 400 naming the item: `input_image` (this
server serves text-only models) and `input_file` unless it is a text file sent inline as
`file_data` (a data URI: text/*, JSON, XML, YAML, CSV...), whose text is then put in the
prompt inside `<file name="...">...</file>`. A `reasoning` input item is accepted and skipped:
its `encrypted_content` is opaque and these models do not reason in hidden tokens.

Log probabilities: `top_logprobs` (0-20, seed 001: "the number of most likely tokens to return
at each token position") or `include: ["message.output_text.logprobs"]` asks for them; either
turns on `SamplingParams.logprobs` (with top_logprobs alternatives, 0 without it).

`truncation: "auto"` sets `Prompt.truncate` on the message prompt: the tokenizer actor then drops
the oldest input items (never the system / instructions message, never the last item) until
the prompt and the output fit the context (actors/tokenizer.py). "disabled" (the default) makes
a prompt that does not fit a 400.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from api.http.openai.grammars import format_guide
from api.http.openai.params import check_stream_options
from api.http.openai.schemas_responses import ResponsesRequest
from api.http.openai.tools.grammar import tool_guide
from api.http.openai.tools.prompt import render_conversation
from api.http.openai.tools.spec import ToolSet
from api.http.openai.tools.validate import build_toolset
from runtime.errors import InvalidRequest
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
    "reasoning.encrypted_content",  # accepted; there are no reasoning items to carry it
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
}
_TEXT_MIME = ("text/", "application/json", "application/xml", "application/x-yaml", "application/yaml", "application/javascript", "application/x-ndjson")
_TEXT_SUFFIX = (".txt", ".md", ".json", ".jsonl", ".csv", ".tsv", ".xml", ".yaml", ".yml", ".py", ".js", ".ts", ".html", ".css", ".toml", ".ini", ".log", ".rst", ".sql", ".sh")


@dataclass(slots=True)
class ResponsesParams:
    prompt: Prompt
    sampling: SamplingParams
    toolset: ToolSet | None
    echo: dict[str, Any]  # the request settings a Response repeats
    logprobs: bool = False  # output_text carries token logprobs


def responses_params(req: ResponsesRequest, template_tools: bool = False) -> ResponsesParams:
    _refuse(req)
    toolset = build_toolset(req.tools, req.tool_choice, req.parallel_tool_calls, req.max_tool_calls)
    text_format = _text_format(req)
    text_guide = format_guide(text_format.get("type"), text_format.get("schema"), "text.format")
    guide: Guide | None = tool_guide(toolset, text_guide) if toolset is not None else text_guide
    messages, kwargs = render_conversation(input_messages(req.input, req.instructions), toolset, template_tools)
    if req.reasoning is not None and req.reasoning.effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning.effort)
    logprobs = req.top_logprobs is not None or LOGPROBS in (req.include or ())
    sampling = SamplingParams(
        max_tokens=req.max_output_tokens,
        max_tokens_param="max_output_tokens",
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        guide=guide,
        logprobs=(req.top_logprobs or 0) if logprobs else None,
    )
    prompt = Prompt(messages=messages, chat_template_kwargs=kwargs, truncate=req.truncation == "auto")
    return ResponsesParams(prompt, sampling, toolset, _echo(req, toolset, text_format), logprobs)


def _refuse(req: ResponsesRequest) -> None:
    for name, why in REFUSED.items():
        value = getattr(req, name)
        if value is not None and not (name in HARMLESS and value is HARMLESS[name]):
            raise InvalidRequest(why, param=name, code="unsupported_parameter")
    if req.prompt is not None:
        # Seed 001 lists `prompt` ("a reference to a prompt template and its variables") among
        # the request fields, not among the four that must be a 400. But it is only a
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
    """text.format in the SDK's flat shape; the seed's nested `json_schema: {...}` is accepted too."""
    fmt = dict(req.text.format) if req.text is not None and req.text.format is not None else {"type": "text"}
    if fmt.get("type") == "json_schema":
        nested = fmt.pop("json_schema", None)
        if isinstance(nested, dict):
            fmt = {**nested, **fmt}
        if "schema" not in fmt:
            raise InvalidRequest("text.format json_schema needs a schema.", param="text.format.schema")
        fmt.setdefault("name", "response")
    return fmt


def _echo(req: ResponsesRequest, toolset: ToolSet | None, text_format: dict[str, Any]) -> dict[str, Any]:
    text: dict[str, Any] = {"format": text_format}
    if req.text is not None and req.text.verbosity is not None:
        text["verbosity"] = req.text.verbosity
    reasoning: dict[str, str | None] | None = None
    if req.reasoning is not None:
        r = req.reasoning
        reasoning = {"effort": r.effort, "generate_summary": r.generate_summary, "summary": r.summary}
        if r.encrypted_content is not None:
            reasoning["encrypted_content"] = r.encrypted_content
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "tools": [t.openai() for t in toolset.tools] if toolset is not None else [],
        "tool_choice": toolset.choice_json() if toolset is not None else (req.tool_choice or "auto"),
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "text": text,
        "reasoning": reasoning,
        "metadata": req.metadata or {},
        "prompt_cache_key": req.prompt_cache_key,
        "prompt_cache_retention": req.prompt_cache_retention,
        "safety_identifier": req.safety_identifier,
        "user": req.user,
        "truncation": req.truncation or "disabled",
        "top_logprobs": req.top_logprobs if req.top_logprobs is not None else 0,
        "store": False,
        "background": False,
        "service_tier": "default",
        "previous_response_id": None,
        "prompt": None,
    }


# -- input items → chat messages ---------------------------------------------------------------


def input_messages(input_: str | list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """`input` (and `instructions`) as Chat-shaped messages: assistant `tool_calls`, `tool` results."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input_, str):
        messages.append({"role": "user", "content": input_})
        return messages
    if not input_:
        raise InvalidRequest("input is empty.", param="input")
    names: dict[str, str] = {}  # call_id → tool name, for the results
    for i, item in enumerate(input_):
        _item(messages, names, item, f"input[{i}]")
    return _merge_leading_system(messages)


def _item(messages: list[dict[str, Any]], names: dict[str, str], item: dict[str, Any], p: str) -> None:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"Unknown role {role!r}; use user, assistant, system or developer.", param=f"{p}.role")
        content = _content(item.get("content"), f"{p}.content")
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    elif kind in ("function_call", "custom_tool_call"):
        name, call_id = _str(item, "name", p), _str(item, "call_id", p)
        names[call_id] = name
        if kind == "function_call":
            arguments = item.get("arguments", "{}")
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        else:
            call = {"id": call_id, "type": "custom", "custom": {"name": name, "input": _str(item, "input", p, empty=True)}}
        _assistant_turn(messages)["tool_calls"].append(call)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        call_id = _str(item, "call_id", p)
        output = _output_text(item.get("output"), f"{p}.output")
        message = {"role": "tool", "tool_call_id": call_id, "content": output}
        if call_id in names:
            message["name"] = names[call_id]
        messages.append(message)
    elif kind == "reasoning":
        return  # opaque (encrypted_content); nothing for these models to read
    elif kind == "item_reference":
        raise InvalidRequest("Item references need stored responses, which this server does not keep.", param=f"{p}.type", code="unsupported_parameter")
    else:
        raise InvalidRequest(f"Input items of type {kind!r} are not supported.", param=f"{p}.type")


def _assistant_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message the next call belongs to: the one just before it, or a new one."""
    if messages and messages[-1]["role"] == "assistant":
        messages[-1].setdefault("tool_calls", [])
        return messages[-1]
    messages.append({"role": "assistant", "content": "", "tool_calls": []})
    return messages[-1]


def _merge_leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    while len(messages) > 1 and messages[0]["role"] == "system" and messages[1]["role"] == "system":
        second = messages.pop(1)
        messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{second['content']}"}
    return messages


def _str(item: dict[str, Any], key: str, p: str, empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (not value and not empty):
        raise InvalidRequest(f"{key} must be a non-empty string.", param=f"{p}.{key}")
    return value


def _content(content: Any, p: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or a list of content blocks.", param=p)
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "refusal" and isinstance(block.get("refusal"), str):
            texts.append(block["refusal"])
        elif kind == "input_image":
            raise InvalidRequest("This model reads text only; input_image is not supported.", param=f"{p}[{j}]", code="unsupported_content")
        elif kind == "input_file":
            texts.append(_file_text(block, f"{p}[{j}]"))
        else:
            raise InvalidRequest(f"Unknown content block type {kind!r}.", param=f"{p}[{j}].type")
    return "".join(texts)


def _output_text(output: Any, p: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(b, dict) for b in output):
        return _content(output, p)
    if output is None:
        raise InvalidRequest("output is required.", param=p)
    return json.dumps(output)


def _file_text(block: dict[str, Any], p: str) -> str:
    name = block.get("filename") or "file"
    data = block.get("file_data")
    if not isinstance(data, str):
        what = "file_id" if block.get("file_id") else "file_url" if block.get("file_url") else "file_data"
        raise InvalidRequest("Files are read only when sent inline as file_data (uploaded files are not stored here).", param=f"{p}.{what}")
    mime = ""
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        mime = head[5:].split(";")[0].lower()
    is_text = mime.startswith(_TEXT_MIME) if mime else str(name).lower().endswith(_TEXT_SUFFIX)
    if not is_text:
        raise InvalidRequest(f"This model reads text only; a {mime or 'binary'} file is not supported (text files are).", param=f"{p}.file_data", code="unsupported_content")
    try:
        text = base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise InvalidRequest("file_data must be base64 of UTF-8 text.", param=f"{p}.file_data") from None
    return f'\n<file name="{name}">\n{text}\n</file>\n'
