"""Qwen3-Coder's XML calls: `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
</function>\n</tool_call>`, one block per call. A value is text; where the tool's schema says a
parameter is not a string, it is read as JSON (and kept as text if it does not parse).

Owns: reading, the grammar (each tool's name and parameter names, values up to their closing
tag) and the history.
"""

from __future__ import annotations

import json
import re
from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, lazy_or_forced, tool_parameters
from api.http.openai.tools.formats.marked import MarkedParser
from api.http.openai.tools.formats.render import render_for_template
from api.http.openai.tools.spec import ToolSet
from runtime.sampling import Guide

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


class Qwen3Coder(ToolFormat):
    name = "qwen3_coder"
    typed_values = False  # values are read by their schema type, not forced by it
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
            names = list((tool_parameters(tool).get("properties") or {}).keys())
            param = f"({' | '.join(json.dumps('<parameter=' + n + '>' + chr(10)) for n in names)}) swy_value" if names else ""
            head = json.dumps(f"\n<function={tool.name}>\n")
            rules.append(f'swy_call_{i}: {head} {f"({param})*" if param else ""} "</function>"')
        more = f'({json.dumps(chr(10))} {self.marker(OPEN)} swy_call)*' if toolset.parallel and toolset.forced is None else ""
        return lazy_or_forced(toolset, text_guide, self.marker(OPEN), f"swy_call {more}", rules)


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
