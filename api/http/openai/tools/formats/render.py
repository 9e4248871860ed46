"""The prompt of a format whose chat template renders tools: `render_for_template`.

Owns: the tools as the template's `tools` argument (a custom tool as a function taking one
string, `input`), and the history's calls and results as the template reads them: ids in the
style it checks (`ToolFormat.history_id`, the same mapping for a call and its result), the
arguments as objects, and, where the template renders no `tool_calls`, the calls written into
the assistant's content in the format's own syntax (`call_text`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, template_tool
from api.http.openai.tools.spec import ToolSet, as_object

CallText = Callable[[list[tuple[str, Any]]], str]  # [(name, arguments)] -> the calls as the model writes them


def render_for_template(
    fmt: ToolFormat, messages: list[dict[str, Any]], toolset: ToolSet | None, call_text: CallText
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    if toolset is not None and toolset.callable():
        kwargs["tools"] = [template_tool(t) for t in toolset.callable()]
    out = []
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
