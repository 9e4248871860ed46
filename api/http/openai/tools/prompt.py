"""Tools in the prompt: the tools block, and the history's calls and results.

Owns: whether a chat template takes `tools`, the system-prompt block that describes tools and
the call format when it does not (and for custom tools always), and rewriting a conversation's
tool calls and tool results for the template or the fallback. Imports api.http.openai.
"""

from __future__ import annotations

import re
from typing import Any

from api.http.openai.common import grammars
from api.http.openai.tools.spec import Tool, ToolSet, as_object, canonical_json, format_call


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders a `tools` argument."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def tools_block(toolset: ToolSet, functions: bool = True) -> str:
    """The system-prompt text that describes the tools and the call format (fallback)."""
    tools = [t for t in toolset.callable() if functions or t.kind == "custom"]
    lines = ["# Tools", "", "You can call these tools:", ""]
    for tool in tools:
        lines.append(f"## {tool.name}")
        if tool.description:
            lines.append(tool.description)
        if tool.kind == "function":
            schema = tool.parameters if tool.parameters is not None else grammars.NO_PARAMETERS
            lines.append(f"Arguments: a JSON object matching this JSON schema: {canonical_json(schema)}")
        elif tool.syntax is not None:
            lines.append(f"Input: plain text matching this {tool.syntax} grammar:\n{tool.definition}")
        else:
            lines.append("Input: plain text.")
        lines.append("")
    lines.append("To call a tool, write exactly:")
    if any(t.kind == "function" for t in tools):
        lines.append(format_call("function", "FUNCTION_NAME", '{"ARGUMENT": "VALUE"}'))
    if any(t.kind == "custom" for t in tools):
        lines.append(format_call("custom", "TOOL_NAME", "THE INPUT, AS PLAIN TEXT"))
    lines.append("Tool results come back inside <tool_response></tool_response>.")
    if toolset.forced is not None:
        lines.append(f"You must call {toolset.forced} now.")
    elif toolset.choice == "required":
        lines.append("You must call at least one tool now.")
    return "\n".join(lines)


def render_conversation(messages: list[dict[str, Any]], toolset: ToolSet | None, template_tools: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages (Chat's shape: assistant `tool_calls`, `tool` messages) ready for the template.

    Returns the messages and the extra chat-template kwargs (`tools` when the template takes
    them). Function tools go to a tool-capable template; everything else (custom tools, or
    all tools when the template cannot take them) goes to a system-prompt block, and the
    history's calls and results are written out in the tool-call format.
    """
    kwargs: dict[str, Any] = {}
    block = ""
    if toolset is not None and toolset.callable():
        functions = [t for t in toolset.callable() if t.kind == "function"]
        if template_tools and functions:
            kwargs["tools"] = [_template_tool(t) for t in functions]
        if not template_tools or len(functions) < len(toolset.callable()):
            block = tools_block(toolset, functions=not template_tools)
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "tool" and not template_tools:
            response = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_responses"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_responses": True})
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            out.append(_assistant(message, template_tools))
        else:
            out.append(dict(message))
    for message in out:
        message.pop("_responses", None)
    if block:
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, kwargs


def _template_tool(tool: Tool) -> dict[str, Any]:
    parameters = tool.parameters if tool.parameters is not None else grammars.NO_PARAMETERS
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "", "parameters": parameters}}


def _assistant(message: dict[str, Any], template_tools: bool) -> dict[str, Any]:
    texts = [message["content"]] if message.get("content") else []
    calls = []
    for call in message["tool_calls"]:
        if call.get("type") == "custom":
            custom = call.get("custom") or {}
            texts.append(format_call("custom", custom.get("name", ""), custom.get("input", "")))
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        if template_tools:
            calls.append({"type": "function", "id": call.get("id"), "function": {"name": function.get("name"), "arguments": as_object(arguments)}})
        else:
            texts.append(format_call("function", function.get("name", ""), canonical_json(arguments)))
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = "\n".join(texts)
    if calls:
        out["tool_calls"] = calls
    return out
