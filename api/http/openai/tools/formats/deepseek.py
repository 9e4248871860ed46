"""DeepSeek V3 / R1 / V3.1 calls, in its own special tokens:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

(V3, R1), or `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` where the template
writes the name before the separator (V3.1 on). Owns: reading, the grammar and the history.
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

CALLS, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCED = re.compile(r"\s*(\w+)\s*\n```json\s*\n(.*?)\n?```\s*$", re.S)


class DeepSeek(ToolFormat):
    name = "deepseek_v3"
    markers = (CALLS, CALLS_END, CALL, CALL_END, SEP)

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.name_first = f"['name'] + '{SEP}'" in self.template  # V3.1: NAME<sep>{json}

    def _one(self, name: str, arguments: Any) -> str:
        args = json.dumps(arguments)
        return f"{CALL}{name}{SEP}{args}{CALL_END}" if self.name_first else f"{CALL}function{SEP}{name}\n```json\n{args}\n```{CALL_END}"

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return render_for_template(self, messages, toolset, lambda calls: CALLS + "".join(self._one(n, a) for n, a in calls) + CALLS_END)

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> MarkedParser:
        return MarkedParser(toolset, prefix, self.new_call_id, read_calls, opens=(CALLS,), closes=CALLS_END)

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        tools = toolset.callable()
        m = self.marker
        rules = [f"swy_call: {m(CALL)} ({' | '.join(f'swy_call_{i}' for i in range(len(tools)))}) {m(CALL_END)}"]
        for i, tool in enumerate(tools):
            args = f"%json {inline_schema(tool_parameters(tool))}"
            if self.name_first:
                rules.append(f"swy_call_{i}: {json.dumps(tool.name)} {m(SEP)} {args}")
            else:
                rules.append(f'swy_call_{i}: "function" {m(SEP)} {json.dumps(tool.name + chr(10) + "```json" + chr(10))} {args} {json.dumps(chr(10) + "```")}')
        more = "swy_call*" if toolset.parallel and toolset.forced is None else ""
        return lazy_or_forced(toolset, text_guide, m(CALLS), f"swy_call {more} {m(CALLS_END)}", rules)


def read_calls(payload: str) -> list[tuple[str, Any]] | None:
    out = []
    for block in payload.split(CALL)[1:]:
        body = block.split(CALL_END)[0]
        head, sep, rest = body.partition(SEP)
        if not sep:
            return None
        fenced = _FENCED.match(rest)
        name, args = (fenced.group(1), fenced.group(2)) if fenced else (head.strip(), rest)
        try:
            out.append((name, json.loads(args)))
        except ValueError:
            return None
    return out or None
