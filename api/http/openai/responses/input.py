"""A Responses request's `input` items (and `instructions`) as the Chat-shaped messages the
chat template reads: assistant `tool_calls`, `tool` results, files as text.

Inputs the model cannot read are refused with a 400 naming the item: `input_image` on a model
that reads text only (a vision-language model gets it as an image part of its message) and `input_file` unless it is a text file sent inline as
`file_data` (a data URI: text/*, JSON, XML, YAML, CSV...), whose text is then put in the
prompt inside `<file name="...">...</file>`. A `reasoning` input item (an earlier turn's
thinking) goes to the assistant turn it precedes as `reasoning_content`, which the chat template
renders or drops as the model was trained; its `encrypted_content` is opaque and ignored.
Imports runtime.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from api.http.openai.common.images import MARKER, image_ref
from runtime.errors import InvalidRequest
from runtime.images import ImageRef

_TEXT_MIME = ("text/", "application/json", "application/xml", "application/x-yaml", "application/yaml", "application/javascript", "application/x-ndjson")
_TEXT_SUFFIX = (".txt", ".md", ".json", ".jsonl", ".csv", ".tsv", ".xml", ".yaml", ".yml", ".py", ".js", ".ts", ".html", ".css", ".toml", ".ini", ".log", ".rst", ".sql", ".sh")


def input_messages(input_: str | list[dict[str, Any]], instructions: str | None, images: list[ImageRef] | None = None) -> list[dict[str, Any]]:
    """`input` (and `instructions`) as Chat-shaped messages: assistant `tool_calls`, `tool` results.
    `images`: where a vision-language model's `input_image`s go, in order (None: text only)."""
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
        _item(messages, names, item, f"input[{i}]", images)
    return _merge_leading_system(messages)


def _item(messages: list[dict[str, Any]], names: dict[str, str], item: dict[str, Any], p: str, images: list[ImageRef] | None = None) -> None:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"Unknown role {role!r}; use user, assistant, system or developer.", param=f"{p}.role")
        content = _content(item.get("content"), f"{p}.content", images if role == "user" else None)
        last = messages[-1] if messages else None
        if role == "assistant" and last is not None and last["role"] == "assistant" and not last["content"] and not last.get("tool_calls"):
            last["content"] = content  # the message its reasoning item opened
            return
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
        text = _reasoning_text(item)
        if text:
            messages.append({"role": "assistant", "content": "", "reasoning_content": text})
    elif kind == "item_reference":
        raise InvalidRequest("Item references need stored responses, which this server does not keep.", param=f"{p}.type", code="unsupported_parameter")
    else:
        raise InvalidRequest(f"Input items of type {kind!r} are not supported.", param=f"{p}.type")


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's thinking: its `reasoning_text` content, else its summary."""
    parts = item.get("content") or item.get("summary") or []
    texts: list[str] = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)] if isinstance(parts, list) else []
    return "\n".join(texts)


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


def _content(content: Any, p: str, images: list[ImageRef] | None = None) -> Any:
    """A message's text; with images (a vision-language model's user message), its parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or a list of content blocks.", param=p)
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "refusal" and isinstance(block.get("refusal"), str):
            parts.append({"type": "text", "text": block["refusal"]})
        elif kind == "input_image" and images is not None:
            if block.get("file_id") and not block.get("image_url"):
                raise InvalidRequest("Images are read only from image_url (uploaded files are not stored here).", param=f"{p}[{j}].file_id")
            images.append(image_ref(block.get("image_url"), block.get("detail"), f"{p}[{j}].image_url"))
            parts.append(MARKER)
        elif kind == "input_image":
            raise InvalidRequest("This model reads text only; input_image is not supported.", param=f"{p}[{j}]", code="unsupported_content")
        elif kind == "input_file":
            parts.append({"type": "text", "text": _file_text(block, f"{p}[{j}]")})
        else:
            raise InvalidRequest(f"Unknown content block type {kind!r}.", param=f"{p}[{j}].type")
    return parts if MARKER in parts else "".join(part["text"] for part in parts)


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
