"""Hermes (Qwen 2.5 / 3, Hermes, SmolLM3, and every template that renders no tools): `<tool_call>`
JSON `</tool_call>`, custom tools' free text and Lark inputs included (tools/spec.py's comment),
and `generic`: a template that renders tools in a way no format here reads is shown our own
tools block instead, and the model writes Hermes calls.

Owns: binding the Hermes modules (tools/prompt.py, grammar.py, parser.py) to the format
interface (formats/base.py).
"""

from __future__ import annotations

from typing import Any

from api.http.openai.tools.formats.base import ToolFormat
from api.http.openai.tools.grammar import tool_guide
from api.http.openai.tools.parser import ToolCallParser
from api.http.openai.tools.prompt import render_conversation
from api.http.openai.tools.spec import ToolSet
from runtime.sampling import Guide


class Hermes(ToolFormat):
    name = "hermes"
    markers = ("<tool_call>", "</tool_call>")
    raw_input = True

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return render_conversation(messages, toolset, self.template_tools)

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        return tool_guide(toolset, text_guide)

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> ToolCallParser:
        return ToolCallParser(toolset or ToolSet(()), prefix)


class Generic(Hermes):
    name = "generic"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.template_tools = False  # its own way of showing tools would teach calls we do not read
