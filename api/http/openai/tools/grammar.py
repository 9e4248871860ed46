"""The grammar that forces the tool-call format (see the package docstring): `tool_guide`.

Owns: the Lark grammar of a request's calls, given its tools and tool_choice: each function's
JSON schema inlined as `%json {...}` (laid out as runtime.grammar_spec.JSON_OPTIONS says) and
each custom tool's grammar embedded under a namespace of its own (grammars.namespace_lark).
Imports llguidance, api.http.openai and runtime.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from api.http.openai.common import grammars
from api.http.openai.tools.spec import OPEN, Tool, ToolSet
from runtime.grammar_spec import JSON_OPTIONS, closed_objects
from runtime.sampling import Guide


def tool_guide(toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
    """The grammar a request's output must follow, given its tools and tool_choice.

    - required: one call (or several, newline-separated, when parallel_tool_calls);
    - a named tool: exactly one call to it;
    - auto: free text (or `text_guide`'s JSON), or calls; once the model starts writing
      `<tool_call` the rest of the call is forced to be valid;
    - none (or no tools): `text_guide`.

    When a call is forced, the part of its opening that no choice is left in (`forced_prefix`)
    is the guide's `prefix`: the prompt ends with it and the grammar starts after it.
    """
    tools = toolset.callable()
    if not tools:
        return text_guide
    heads = [_call_head(tool) for tool in tools]
    rules = [f"swy_body_{i}: {_call_body(i, tool)}" for i, tool in enumerate(tools)]
    rules += [f"swy_tool_{i}: {_rest(head, len(OPEN), i)}" for i, head in enumerate(heads)]
    embedded = [_embedded_grammar(i, tool) for i, tool in enumerate(tools)]
    rules.append("swy_after: " + " | ".join(f"swy_tool_{i}" for i in range(len(tools))))
    rules.append('swy_call: "<tool_call" swy_after')
    rules.append(f"swy_more: {_more_calls(toolset)}")
    prefix = ""
    if toolset.forcing:
        prefix = forced_prefix(tools)
        rules.append("swy_first: " + " | ".join(_rest(head, len(prefix), i) for i, head in enumerate(heads)))
        start = "start: swy_first swy_more"
    elif text_guide is not None:
        rules.append(f"swy_free: %json {_inline_schema(_text_schema(text_guide))}")
        start = "start: swy_free | swy_call swy_more"
    else:
        rules.append('swy_head[lazy]: SWY_TEXT "<tool_call"')
        rules.append(r"SWY_TEXT: /(.|\n)*/")
        start = "start: SWY_TEXT | swy_head swy_after swy_more"
    lark = "\n".join([start, *rules, *filter(None, embedded)]) + "\n"
    return Guide(kind="lark", definition=lark, param="tools", prefix=prefix)


def forced_prefix(tools: tuple[Tool, ...]) -> str:
    """The opening every forced call shares, cut where a tokenizer would cut anyway.

    One tool: its whole head, up to `"arguments":` (the space before the arguments goes with
    their first token, as ` {"` does in BPE vocabularies) or, for a custom tool, the header
    line. Several function tools: up to the name's opening quote. Function and custom tools
    mixed share only `<tool_call`, which would split the `<tool_call>` token some
    vocabularies have, so nothing is prefilled then.
    """
    if len(tools) == 1:
        head = _call_head(tools[0])
        return head.rstrip(" ")
    if all(tool.kind == "function" for tool in tools):
        return _FUNCTION_OPEN
    return ""


_FUNCTION_OPEN = '<tool_call>\n{"name": "'


def _call_head(tool: Tool) -> str:
    """A call's text before its arguments or input (see spec.format_call)."""
    if tool.kind == "function":
        return f'{_FUNCTION_OPEN}{tool.name}", "arguments": '
    return f'{OPEN} name="{tool.name}">\n'


def _rest(head: str, done: int, i: int) -> str:
    """Lark for tool i's call once the first `done` characters of its `head` are written."""
    rest = head[done:]
    return f"{_lit(rest)} swy_body_{i}" if rest else f"swy_body_{i}"


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
    """Lark for a call after its head (`_call_head`)."""
    end = _lit("\n</tool_call>")
    if tool.kind == "function":
        return f"%json {_inline_schema(grammars.arguments_schema(tool.parameters))} {_lit('}')} {end}"
    if tool.syntax is None:  # free text up to the closing tag
        return f"swy_input_{i}"
    return f"swy_g{i}_start {end}"


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
