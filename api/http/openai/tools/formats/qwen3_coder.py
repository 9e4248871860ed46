"""Qwen3-Coder's XML calls: `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
</function>\n</tool_call>`, one block per call. A value is text; where the tool's schema says a
parameter is not a string, it is read as JSON (and kept as text if it does not parse).

Owns: reading, the grammar and the history. The grammar holds a call to its tool's schema as
the JSON formats' do: the tool's name, its parameters in the schema's order (the required ones
always, each at most once), a string's value as text (one of its `enum` where it has one; a
`pattern` is not held), any other typed value as its schema's JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, inline_schema, lazy_or_forced, tool_parameters
from api.http.openai.tools.formats.marked import MarkedParser
from api.http.openai.tools.formats.render import render_for_template
from api.http.openai.tools.spec import ToolSet
from runtime.sampling import Guide

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


class Qwen3Coder(ToolFormat):
    name = "qwen3_coder"
    typed_values = False  # a string's pattern is not held (a regex custom tool: a 400)
    markers = (OPEN, CLOSE)

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return render_for_template(self, messages, toolset, lambda calls: "".join(_block(n, a) for n, a in calls))

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> MarkedParser:
        types = {t.name: _types(t) for t in toolset.callable()} if toolset is not None else {}
        return MarkedParser(toolset, prefix, self.new_call_id, lambda p: read_call(p, types), opens=(OPEN,), closes=CLOSE)

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        tools = toolset.callable()
        rules = [f"swy_call: ({' | '.join(f'swy_call_{i}' for i in range(len(tools)))}) {json.dumps(chr(10))} {self.marker(CLOSE)}"]
        rules.append(r"swy_value[lazy]: /(?s:.*)\n<\/parameter>\n/")
        for i, tool in enumerate(tools):
            schema = tool_parameters(tool)
            required, parts = set(schema.get("required") or ()), []
            for j, (name, prop) in enumerate((schema.get("properties") or {}).items()):
                rules.append(f"swy_param_{i}_{j}: {json.dumps('<parameter=' + name + '>' + chr(10))} {_value(prop or {})}")
                parts.append(f"swy_param_{i}_{j}" + ("" if name in required else "?"))
            rules.append(f'swy_call_{i}: {json.dumps(f"{chr(10)}<function={tool.name}>{chr(10)}")} {" ".join(parts)} "</function>"')
        more = f'({json.dumps(chr(10))} {self.marker(OPEN)} swy_call)*' if toolset.parallel and toolset.forced is None else ""
        return lazy_or_forced(toolset, text_guide, self.marker(OPEN), f"swy_call {more}", rules)


def _value(schema: dict[str, Any]) -> str:
    """A parameter's value through its closing tag: text for a string (one of its enum), the
    schema's JSON for any other type (text where the schema names none)."""
    end = json.dumps("\n</parameter>\n")
    kind, enum = schema.get("type"), schema.get("enum")
    if kind == "string" and enum:
        return f"({' | '.join(json.dumps(str(v)) for v in enum)}) {end}"
    if kind in (None, "string"):
        return "swy_value"
    return f"%json {inline_schema(schema)} {end}"


def _types(tool: Any) -> dict[str, Any]:
    return {k: (v or {}).get("type") for k, v in (tool_parameters(tool).get("properties") or {}).items()}


def _block(name: str, arguments: Any) -> str:
    params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n" for k, v in (arguments or {}).items())
    return f"{OPEN}\n<function={name}>\n{params}</function>\n{CLOSE}"


def read_call(payload: str, types: dict[str, dict[str, Any]]) -> list[tuple[str, Any]] | None:
    m = _FUNCTION.match(payload)
    if m is None:
        return None
    name = m.group(1).strip()
    args: dict[str, Any] = {}
    for key, value in _PARAMETER.findall(m.group(2)):
        kind = types.get(name, {}).get(key.strip())
        if kind not in (None, "string"):
            try:
                args[key.strip()] = json.loads(value)
                continue
            except ValueError:
                pass
        args[key.strip()] = value
    return [(name, args)]
