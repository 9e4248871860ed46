"""Formats whose calls are JSON after a marker: Llama 3.x, Granite 3.x and Mistral.

- llama3_json: `{"name": ..., "parameters": {...}}` as the whole turn, or after `<|python_tag|>`;
  one call a turn (Llama 3.1's template refuses more: a history with more is a 400 naming it).
- granite: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`.
- phi4_mini_json: Phi-4-mini's `<|tool_call|>[...]<|/tool_call|>` (the close often missing),
  or `functools[...]` as vLLM's example template teaches; its template reads the tools as a
  JSON string on the system message (`tools`), not as an argument.
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (v0.3, Nemo), or
  `[TOOL_CALLS]name[ARGS]{...}` per call where the template writes `[ARGS]` (Small 3.2 and
  later); ids are 9 letters and digits, which its templates check.
Owns: each one's reading, grammar and history syntax.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, calls_schema, inline_schema, lazy_or_forced, tool_parameters
from api.http.openai.tools.formats.marked import MarkedParser
from api.http.openai.tools.formats.render import render_for_template
from api.http.openai.tools.spec import ToolSet
from runtime.errors import InvalidRequest
from runtime.sampling import Guide


def _objects(payload: str) -> list[Any] | None:
    """JSON values in `payload`: one value (a list spreads), or several separated by ; or newlines."""
    text = payload.strip()
    try:
        value = json.loads(text)
        return value if isinstance(value, list) else [value]
    except ValueError:
        pass
    decoder, out, i = json.JSONDecoder(), list[Any](), 0
    while i < len(text):
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i == len(text):
            break
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)
    return out or None


def _named(values: list[Any] | None, *keys: str) -> list[tuple[str, Any]] | None:
    """(name, arguments) of each {"name": ..., <key>: ...} object; None if any is not one."""
    out: list[tuple[str, Any]] = []
    for value in values or ():
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        out.append((value["name"], next((value[k] for k in keys if k in value), {})))
    return out or None


class Llama3Json(ToolFormat):
    name = "llama3_json"
    TAG = "<|python_tag|>"
    markers = (TAG,)

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        for i, message in enumerate(messages):
            if message.get("role") == "assistant" and len(message.get("tool_calls") or ()) > 1:
                raise InvalidRequest(
                    f"This model's chat template takes one tool call per assistant turn; messages[{i}].tool_calls has {len(message['tool_calls'])}.",
                    param=f"messages[{i}].tool_calls",
                )
        return render_for_template(self, messages, toolset, lambda calls: "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls))

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> MarkedParser:
        return MarkedParser(toolset, prefix, self.new_call_id, lambda p: _named(_objects(p), "parameters", "arguments"), opens=(self.TAG,), leads=("{",))

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        body = f"%json {inline_schema(calls_schema(toolset, 'parameters', listed=False))}"
        tag = f"{self.marker(self.TAG)}?" if self.is_special(self.TAG) else ""
        if toolset.forcing:
            return Guide(kind="lark", definition=f"start: {tag} {body}\n", param="tools")
        free = f"%json {inline_schema(_text_schema(text_guide))}" if text_guide is not None else "SWY_PLAIN"
        rules = [f"start: {free} | {tag} {body}", r"SWY_PLAIN: /([^{](.|\n)*)?/"]  # an answer that opens with { is a call
        return Guide(kind="lark", definition="\n".join(rules) + "\n", param="tools")


class Granite(ToolFormat):
    name = "granite"
    TAG = "<|tool_call|>"
    markers = (TAG,)

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return render_for_template(self, messages, toolset, lambda calls: self.TAG + json.dumps([{"name": n, "arguments": a} for n, a in calls]))

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> MarkedParser:
        return MarkedParser(toolset, prefix, self.new_call_id, lambda p: _named(_objects(p), "arguments", "parameters"), opens=(self.TAG,))

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        return lazy_or_forced(toolset, text_guide, self.marker(self.TAG), f"%json {inline_schema(calls_schema(toolset))}", [])


class Phi4Mini(ToolFormat):
    name = "phi4_mini_json"
    TAG, CLOSE, LEAD = "<|tool_call|>", "<|/tool_call|>", "functools["
    SYSTEM = "You are a helpful assistant with some tools."  # Microsoft's example, when the request has no system text
    markers = (TAG, CLOSE)

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        out, kwargs = render_for_template(self, messages, toolset, self._call_text)
        tools = kwargs.pop("tools", None)
        if tools:  # the template reads them off the system message, as a JSON list of functions
            listed = json.dumps([t["function"] for t in tools], ensure_ascii=False)
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "tools": listed}
            else:
                out.insert(0, {"role": "system", "content": self.SYSTEM, "tools": listed})
        return out, kwargs

    def _call_text(self, calls: list[tuple[str, Any]]) -> str:
        return self.TAG + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + self.CLOSE

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> MarkedParser:
        return MarkedParser(toolset, prefix, self.new_call_id, self._read, opens=(self.TAG, self.LEAD))

    def _read(self, payload: str) -> list[tuple[str, Any]] | None:
        body = payload.split(self.CLOSE)[0].strip()
        if body.endswith("]") and not body.startswith("["):  # after `functools[`: the marker took the list's opening
            body = "[" + body
        return _named(_objects(body), "arguments", "parameters")

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        body = f"%json {inline_schema(calls_schema(toolset))} {self.marker(self.CLOSE)}"
        return lazy_or_forced(toolset, text_guide, self.marker(self.TAG), body, [])


class Mistral(ToolFormat):
    name = "mistral"
    TAG, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    markers = (TAG, ARGS, CALL_ID)

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.args_form = self.ARGS in self.template  # [TOOL_CALLS]name[ARGS]{...} rather than a JSON list

    def new_call_id(self) -> str:
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))

    def history_id(self, call_id: str) -> str:
        if re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
            return call_id
        digest = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
        alphabet = string.ascii_letters + string.digits
        return "".join(alphabet[(digest >> (6 * i)) % len(alphabet)] for i in range(9))

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return render_for_template(self, messages, toolset, self._call_text)

    def _call_text(self, calls: list[tuple[str, Any]]) -> str:
        if self.args_form:
            return "".join(f"{self.TAG}{n}{self.ARGS}{json.dumps(a)}" for n, a in calls)
        return self.TAG + json.dumps([{"name": n, "arguments": a} for n, a in calls])

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> MarkedParser:
        return MarkedParser(toolset, prefix, self.new_call_id, self._read, opens=(self.TAG,))

    def _read(self, payload: str) -> list[tuple[str, Any]] | None:
        if not self.args_form or payload.lstrip().startswith("["):
            return _named(_objects(payload), "arguments", "parameters")
        out = []
        for part in filter(None, payload.split(self.TAG)):
            head, sep, args = part.partition(self.ARGS)
            name = head.split(self.CALL_ID)[0].strip()
            try:
                out.append((name, json.loads(args)))
            except ValueError:
                return None
            if not sep or not name:
                return None
        return out or None

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        if not self.args_form:
            return lazy_or_forced(toolset, text_guide, self.marker(self.TAG), f"%json {inline_schema(calls_schema(toolset))}", [])
        tools = toolset.callable()
        rules = [f"swy_call: {' | '.join(f'swy_call_{i}' for i in range(len(tools)))}"]
        rules += [f"swy_call_{i}: {json.dumps(t.name)} {self.marker(self.ARGS)} %json {inline_schema(tool_parameters(t))}" for i, t in enumerate(tools)]
        more = f"({self.marker(self.TAG)} swy_call)*" if toolset.parallel and toolset.forced is None else ""
        return lazy_or_forced(toolset, text_guide, self.marker(self.TAG), f"swy_call {more}", rules)


def _text_schema(guide: Guide | None) -> dict[str, Any]:
    return json.loads(guide.definition) if guide is not None and guide.kind == "json_schema" else {"type": "object"}

