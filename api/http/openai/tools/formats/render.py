"""The prompt of a format whose chat template renders tools: `render_for_template`.

Owns: the tools as the template's `tools` argument (a custom tool as a function taking one
string, `input`), and the history's calls and results as the template reads them: ids in the
style it checks (`ToolFormat.history_id`, the same mapping for a call and its result), the
arguments as objects, and, where the template renders no `tool_calls`, the calls written into
the assistant's content in the format's own syntax (`call_text`). A template that renders no
tools at all (DeepSeek-V3.1's: its model card has the client describe them in the system
prompt) gets that description, in the card's layout, with the call in the format's syntax.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, template_tool
from api.http.openai.tools.spec import ToolSet, as_object

CallText = Callable[[list[tuple[str, Any]]], str]  # [(name, arguments)] -> the calls as the model writes them


def render_for_template(
    fmt: ToolFormat, messages: list[dict[str, Any]], toolset: ToolSet | None, call_text: CallText
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    out: list[dict[str, Any]] = []
    if toolset is not None and toolset.callable():
        kwargs["tools"] = [template_tool(t) for t in toolset.callable()]
        if not fmt.template_tools:
            messages = _with_system(messages, _tools_prompt(kwargs["tools"], call_text))
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            out.append(_assistant(fmt, message, call_text))
        elif message.get("role") == "tool":
            out.append({**message, "tool_call_id": fmt.history_id(str(message.get("tool_call_id") or ""))})
        else:
            out.append(dict(message))
    return out, kwargs


def history_calls(message: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """An assistant message's calls as (id, name, arguments object), custom calls' input as {"input": ...}."""
    out = []
    for call in message.get("tool_calls") or ():
        if call.get("type") == "custom":
            custom = call.get("custom") or {}
            out.append((call.get("id") or "", custom.get("name", ""), {"input": custom.get("input", "")}))
        else:
            function = call.get("function") or {}
            out.append((call.get("id") or "", function.get("name", ""), as_object(function.get("arguments") or "{}")))
    return out


def _assistant(fmt: ToolFormat, message: dict[str, Any], call_text: CallText) -> dict[str, Any]:
    calls = history_calls(message)
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if not fmt.template_calls:
        out["content"] = (message.get("content") or "") + call_text([(name, arguments) for _, name, arguments in calls])
        return out
    out["content"] = message.get("content") or ""
    out["tool_calls"] = [{"type": "function", "id": fmt.history_id(i), "function": {"name": n, "arguments": a}} for i, n, a in calls]
    return out


def _tools_prompt(tools: list[dict[str, Any]], call_text: CallText) -> str:
    """The tools as DeepSeek-V3.1's model card lays them out, the call in the format's syntax."""
    lines = ["## Tools", "You have access to the following tools:", ""]
    for tool in tools:
        function = tool["function"]
        lines += [f"### {function['name']}", f"Description: {function['description']}", "", f"Parameters: {json.dumps(function['parameters'])}", ""]
    example = call_text([("tool_call_name", {"argument": "value"})])
    lines += ["IMPORTANT: ALWAYS adhere to this exact format for tool use:", example, "", "Where:",
              "- `tool_call_name` must be an exact match to one of the available tools",
              "- the arguments must be valid JSON that strictly follows the tool's Parameters Schema"]  # fmt: skip
    return "\n".join(lines)


def _with_system(messages: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
