"""The tool-call format and the declared tools (the comment below says what the format is).

Owns: `Tool` and `ToolSet` (the tools a request declared and its tool_choice, validated by
validate.py), the format's markers and `format_call`, and the one JSON layout the model is
shown (`canonical_json`). Imports the standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The format the model writes (and is forced to write when a call is required or named):
#
#     <tool_call>
#     {"name": "get_weather", "arguments": {"city": "Paris"}}
#     </tool_call>
#
# for a function: the Hermes format that tool-capable chat templates (Qwen, Hermes, SmolLM3...)
# teach. A custom tool's input is plain text, never JSON, so it has a form of its own:
#
#     <tool_call name="apply_patch">
#     *** Begin Patch ...
#     </tool_call>
#
# Several calls are separated by a newline. JSON is shown and forced with `json.dumps`'s ", " and
# ": " separators and no other whitespace (`runtime.grammar_spec.JSON_OPTIONS`): the history's
# arguments are re-serialized that way, so the model never sees a layout it may not write.
#
# When a call is forced (tool_choice `required` or a named tool), the opening that leaves no
# choice is not generated: for one tool, its opening up to `"arguments":` (a custom tool's
# header line); for several function tools, `<tool_call>\n{"name": "`; nothing when function
# and custom tools are mixed (grammar.py `forced_prefix`). It is the grammar's `Guide.prefix`:
# the tokenizer actor writes it after the assistant's generation prompt, the grammar starts
# after it, and the parser reads it first, so the client sees the same calls, whole and
# streamed. Usage counts it in prompt_tokens (it was prefilled); completion_tokens counts only
# the generated tokens, and logprobs cover only those. A forced call so generates only what is
# left to choose: its arguments (or input) and the closing tag.
#
# A call names a tool the model may call now, or it is not a call: `<tool_call>` text that names
# an undeclared (or, under tool_choice, disallowed) tool is left in the output as plain text,
# never turned into a function_call the client would try to dispatch. The grammar makes such text
# impossible while enforcement holds; this is the fallback when it does not.
#
# When the chat template takes `tools` (`apply_chat_template(..., tools=...)`), function tools go
# to it; otherwise, and for custom tools always, a system-prompt block (`tools_block`) describes
# the tools and this format.
# Tool results go back to the model as `tool` messages (template) or as
# `<tool_response>...</tool_response>` blocks in a user message (fallback).
OPEN, CLOSE = "<tool_call", "</tool_call>"


@dataclass(frozen=True, slots=True)
class Tool:
    kind: str  # "function" | "custom"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a function's JSON schema
    strict: bool | None = None
    syntax: str | None = None  # a custom tool's grammar syntax ("lark", "regex"); None: free text
    definition: str | None = None
    param: str = ""  # where the request declared it ("tools[2]"), for errors found later

    def openai(self) -> dict[str, Any]:
        """The tool as the Responses API echoes it."""
        if self.kind == "function":
            return {"type": "function", "name": self.name, "description": self.description, "parameters": self.parameters, "strict": self.strict}
        fmt: dict[str, Any] = {"type": "text"}
        if self.syntax is not None:
            fmt = {"type": "grammar", "syntax": self.syntax, "definition": self.definition}
        return {"type": "custom", "name": self.name, "description": self.description, "format": fmt}


@dataclass(frozen=True, slots=True)
class ToolSet:
    tools: tuple[Tool, ...]
    choice: str = "auto"  # "auto" | "none" | "required"
    forced: str | None = None  # the tool tool_choice names
    allowed: frozenset[str] | None = None  # tool_choice allowed_tools
    parallel: bool = True
    max_calls: int | None = None  # Responses' max_tool_calls: the grammar allows no more

    @property
    def forcing(self) -> bool:
        """tool_choice leaves the model no answer but calls (`required` or a named tool)."""
        return self.choice == "required" or self.forced is not None

    def get(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def callable(self) -> tuple[Tool, ...]:
        """The tools the model may call now."""
        if self.choice == "none":
            return ()
        if self.forced is not None:
            return tuple(t for t in self.tools if t.name == self.forced)
        if self.allowed is not None:
            return tuple(t for t in self.tools if t.name in self.allowed)
        return self.tools

    def choice_json(self) -> str | dict[str, Any]:
        if self.forced is not None:
            tool = self.get(self.forced)
            return {"type": tool.kind if tool else "function", "name": self.forced}
        if self.allowed is not None:
            return {"type": "allowed_tools", "mode": self.choice, "tools": [t.openai() for t in sorted(self.tools, key=lambda t: t.name) if t.name in self.allowed]}
        return self.choice


def format_call(kind: str, name: str, text: str) -> str:
    """One call in the tool-call format. `text`: a function's arguments (JSON) or custom input."""
    if kind == "function":
        return f'{OPEN}>\n{{"name": "{name}", "arguments": {text or "{}"}}}\n{CLOSE}'
    return f'{OPEN} name="{name}">\n{text}\n{CLOSE}'


def canonical_json(value: Any) -> str:
    """JSON as the model is shown it and forced to write it (", " and ": ", nothing else);
    a string is re-serialized when it is JSON and kept as it is otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, ensure_ascii=False)


def as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
