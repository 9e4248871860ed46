"""Pythonic calls (LFM2, Llama 3.2 and 4's pythonic templates): `[get_weather(city='Paris'), ...]`,
wrapped in `<|tool_call_start|>` ... `<|tool_call_end|>` where the template says so, else the
whole answer. Arguments are Python literals, read with `ast` (never evaluated).

Owns: reading, the grammar and the history's syntax. The grammar holds a call to its tool's
schema as the JSON formats' do: the tool's name, its keyword arguments in the schema's order
(the required ones always, each at most once), each value the Python literal of its type (a
string's `enum` held; an array's items and an object's fields any literal).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, lazy_or_forced, tool_parameters
from api.http.openai.tools.formats.marked import MarkedParser
from api.http.openai.tools.formats.render import render_for_template
from api.http.openai.tools.spec import ToolSet
from runtime.sampling import Guide

OPEN, CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
VALUE_RULES = [
    'swy_value: SWY_STRING | SWY_NUMBER | "True" | "False" | "None" | swy_list | swy_dict',
    'swy_list: "[" (swy_value (", " swy_value)*)? "]"',
    'swy_dict: "{" (SWY_STRING ": " swy_value (", " SWY_STRING ": " swy_value)*)? "}"',
    r"""SWY_STRING: /'([^'\\\n]|\\.)*'/ | /"([^"\\\n]|\\.)*"/""",
    r"SWY_NUMBER: /-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?/",
]


_LITERALS = {"integer": r"/-?[0-9]+/", "number": "SWY_NUMBER", "boolean": '"True" | "False"', "null": '"None"', "array": "swy_list", "object": "swy_dict"}


def _arguments(i: int, schema: dict[str, Any]) -> list[str]:
    """Tool `i`'s keyword arguments in the schema's order, the required ones always: rules
    `swy_first_{i}_{j}` (arguments j.. with no comma before the first) and `swy_rest_{i}_{j}`
    (each after a comma), the first of them last."""
    params = list((schema.get("properties") or {}).items())
    required = set(schema.get("required") or ())
    rules: list[str] = []
    for j in reversed(range(len(params))):
        name, prop = params[j]
        kw = f"({json.dumps(name + '=')} {_literal(prop or {})})"
        rest = f"swy_rest_{i}_{j + 1}" if j + 1 < len(params) else ""
        if name in required:
            rules += [f'swy_rest_{i}_{j}: ", " {kw} {rest}', f"swy_first_{i}_{j}: {kw} {rest}"]
        else:
            later = f" | swy_first_{i}_{j + 1}" if rest else "?"
            rules += [f'swy_rest_{i}_{j}: (", " {kw})? {rest}', f"swy_first_{i}_{j}: ({kw} {rest}){later}"]
    return rules


def _literal(schema: dict[str, Any]) -> str:
    """A value of the schema's type as a Python literal (any literal where it names none)."""
    kind, enum = schema.get("type"), schema.get("enum")
    if kind == "string":
        return f"({' | '.join(json.dumps(repr(str(v))) for v in enum)})" if enum else "SWY_STRING"
    return _LITERALS.get(kind, "swy_value") if isinstance(kind, str) else "swy_value"


def read_calls(payload: str) -> list[tuple[str, Any]] | None:
    try:
        tree = ast.parse(payload.strip(), mode="eval").body
    except SyntaxError:
        return None
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    out = []
    for node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            out.append((node.func.id, {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}))
        except ValueError:
            return None
    return out or None


def call_text(calls: list[tuple[str, Any]]) -> str:
    return "[" + ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in (args or {}).items())})" for name, args in calls) + "]"


class Pythonic(ToolFormat):
    name = "pythonic"
    typed_values = False  # a string's pattern is not held (a regex custom tool: a 400)
    markers = (OPEN, CLOSE)

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.wrapped = OPEN in self.template or "<|tool_list_start|>" in self.template  # LFM2's template lists tools so; its calls are wrapped

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return render_for_template(self, messages, toolset, lambda calls: f"{OPEN}{call_text(calls)}{CLOSE}" if self.wrapped else call_text(calls))

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> MarkedParser:
        if self.wrapped:
            return MarkedParser(toolset, prefix, self.new_call_id, read_calls, opens=(OPEN,), closes=CLOSE)
        return MarkedParser(toolset, prefix, self.new_call_id, read_calls, leads=("[",))

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        tools = toolset.callable()
        rules = [f"swy_call: {' | '.join(f'swy_call_{i}' for i in range(len(tools)))}", *VALUE_RULES]
        for i, tool in enumerate(tools):
            arguments = _arguments(i, tool_parameters(tool))
            rules += [*arguments, f'swy_call_{i}: {json.dumps(tool.name + "(")} {f"swy_first_{i}_0" if arguments else ""} ")"']
        many = toolset.parallel and toolset.forced is None
        body = f'swy_call ({json.dumps(", ")} swy_call)* "]"' if many else 'swy_call "]"'
        if self.wrapped:
            return lazy_or_forced(toolset, text_guide, self.marker(OPEN), f'"[" {body} {self.marker(CLOSE)}', rules)
        if toolset.forcing:
            return Guide(kind="lark", definition="\n".join([f'start: "[" {body}', *rules]) + "\n", param="tools")
        rules += [r"SWY_PLAIN: /([^\[](.|\n)*)?/"]  # an answer that opens with [ is calls
        return Guide(kind="lark", definition="\n".join([f'start: SWY_PLAIN | "[" {body}', *rules]) + "\n", param="tools")
