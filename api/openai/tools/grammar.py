"""The grammar that forces the tool-call format (see the package docstring): `tool_guide`.

Owns: the Lark grammar of a request's calls, given its tools and tool_choice: each function's
JSON schema inlined as `%json {...}` (laid out as runtime.grammar_spec.JSON_OPTIONS says) and
each custom tool's grammar embedded under a namespace of its own (grammars.namespace_lark).
Imports llguidance, api.openai and runtime.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from api.openai import grammars
from api.openai.tools.spec import Tool, ToolSet
from runtime.grammar_spec import JSON_OPTIONS, closed_objects
from runtime.sampling import Guide


def tool_guide(toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
    """The grammar a request's output must follow, given its tools and tool_choice.

    - required: one call (or several, newline-separated, when parallel_tool_calls);
    - a named tool: exactly one call to it;
    - auto: free text (or `text_guide`'s JSON), or calls; once the model starts writing
      `<tool_call` the rest of the call is forced to be valid;
    - none (or no tools): `text_guide`.
    """
    tools = toolset.callable()
    if not tools:
        return text_guide
    rules = [f"swy_tool_{i}: {_call_body(i, tool)}" for i, tool in enumerate(tools)]
    embedded = [_embedded_grammar(i, tool) for i, tool in enumerate(tools)]
    rules.append("swy_after: " + " | ".join(f"swy_tool_{i}" for i in range(len(tools))))
    rules.append('swy_call: "<tool_call" swy_after')
    rules.append(f"swy_more: {_more_calls(toolset)}")
    if toolset.choice == "required" or toolset.forced is not None:
        start = "start: swy_call swy_more"
    elif text_guide is not None:
        rules.append(f"swy_free: %json {_inline_schema(_text_schema(text_guide))}")
        start = "start: swy_free | swy_call swy_more"
    else:
        rules.append('swy_head[lazy]: SWY_TEXT "<tool_call"')
        rules.append(r"SWY_TEXT: /(.|\n)*/")
        start = "start: SWY_TEXT | swy_head swy_after swy_more"
    lark = "\n".join([start, *rules, *filter(None, embedded)]) + "\n"
    return Guide(kind="lark", definition=lark, param="tools")


def _more_calls(toolset: ToolSet) -> str:
    """Calls after the first: none for a named tool or without parallel_tool_calls, else up
    to max_tool_calls - 1 (unbounded without it), so the model cannot call past the limit."""
    if not toolset.parallel or toolset.forced is not None:
        return ""
    if toolset.max_calls is None:
        return '("\\n" swy_call)*'
    if toolset.max_calls <= 1:
        return ""
    return f'("\\n" swy_call)~0..{toolset.max_calls - 1}'


def _call_body(i: int, tool: Tool) -> str:
    end = _lit("\n</tool_call>")
    if tool.kind == "function":
        head = _lit(f'>\n{{"name": "{tool.name}", "arguments": ')
        return f"{head} %json {_inline_schema(grammars.arguments_schema(tool.parameters))} {_lit('}')} {end}"
    head = _lit(f' name="{tool.name}">\n')
    if tool.syntax is None:  # free text up to the closing tag
        return f"{head} swy_input_{i}"
    return f"{head} swy_g{i}_start {end}"


def _embedded_grammar(i: int, tool: Tool) -> str:
    if tool.kind == "function":
        return ""
    if tool.syntax is None:
        return f"swy_input_{i}[lazy]: /(?s:.*)\\n<\\/tool_call>/"
    assert tool.definition is not None
    if tool.syntax == "regex":
        return f"swy_g{i}_start: /{llguidance.regex_to_lark(tool.definition)}/"
    return grammars.namespace_lark(tool.definition, f"swy_g{i}_")


def _inline_schema(schema: dict[str, Any]) -> str:
    schema = closed_objects(schema)
    schema.setdefault("x-guidance", JSON_OPTIONS)
    return json.dumps(schema)


def _text_schema(guide: Guide) -> dict[str, Any]:
    if guide.kind == "json_schema":
        return json.loads(guide.definition)
    return {"type": "object"}


def _lit(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text)
