"""What a tool-call format is: `ToolFormat`, bound to one model's tokenizer, and what formats share.

Owns: the interface every format answers (how the tools and the history's calls are put in the
prompt, the grammar that forces a call or wakes on the format's opening marker, the parser
that reads calls back, the ids the template accepts) and the pieces most formats build from:
markers as grammar terminals (a special token by id where the tokenizer has one) and JSON
call schemas. A custom tool is shown to a non-Hermes format as a function with one string
argument, `input` (a regex grammar as the string's pattern), and read back as its custom call;
a Lark grammar cannot constrain a JSON string, so it is a 400 there (Hermes writes raw input),
as is any grammar where the format's values are not held to a schema.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from api.http.openai.common import grammars
from api.http.openai.tools.spec import Tool, ToolSet, as_object, canonical_json
from runtime.errors import InvalidRequest
from runtime.grammar_spec import JSON_OPTIONS, closed_objects
from runtime.sampling import Guide
from runtime.tool_formats import takes_tools, template_text

INPUT = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"], "additionalProperties": False}


def new_openai_id() -> str:
    return "call_" + secrets.token_hex(12)


class ToolFormat:
    """How one model family writes tool calls (the Hermes subclass is the default)."""

    name = ""
    markers: tuple[str, ...] = ()  # the text that marks its calls (special tokens in some vocabularies)
    raw_input = False  # a custom tool's input is written raw (Hermes), not as a JSON string
    typed_values = True  # argument values are held to their schema (not Qwen3-Coder's XML, pythonic)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.template = template_text(tokenizer)
        self.template_tools = takes_tools(self.template)  # function tools go to the template
        self.template_calls = "tool_calls" in self.template  # the template renders the history's calls itself
        self._special = {str(t): i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}

    # -- ids ----------------------------------------------------------------------------------

    def new_call_id(self) -> str:
        return new_openai_id()

    def history_id(self, call_id: str) -> str:
        """A call id from the history (this server's, or another provider's) as the template wants it."""
        return call_id

    # -- the format, per subclass ---------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        raise NotImplementedError

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        raise NotImplementedError

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> Any:
        """The reader of one output: ToolCallParser's events (tools/parser.py), and ("reasoning",
        text) where the format splits out thinking itself."""
        raise NotImplementedError

    # -- shared pieces --------------------------------------------------------------------------

    def marker(self, text: str) -> str:
        """A marker as a Lark terminal: its special token by id when the tokenizer has it as one
        special token (the model writes that token, never the text), else the literal text."""
        token = self._special.get(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)

    def is_special(self, text: str) -> bool:
        return text in self._special

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether outputs must be decoded with their special tokens: where the format's markers
        are special tokens here, its parser reads them (the end of text is never in the text)."""
        return any(self.is_special(m) for m in self.markers)


def tool_parameters(tool: Tool) -> dict[str, Any]:
    """A tool's arguments schema as a non-Hermes format shows and forces it."""
    if tool.kind == "function":
        return grammars.arguments_schema(tool.parameters)
    if tool.syntax == "regex":
        return {**INPUT, "properties": {"input": {"type": "string", "pattern": f"^(?:{tool.definition})$"}}}
    return INPUT


def check_custom_tools(fmt: ToolFormat, toolset: ToolSet) -> None:
    """A Lark-constrained custom tool on a format that writes its input as a JSON string: a 400."""
    if fmt.raw_input:
        return
    for tool in toolset.callable():
        if tool.kind == "custom" and (tool.syntax == "lark" or (tool.syntax is not None and not fmt.typed_values)):
            why = "a JSON string a Lark grammar cannot constrain" if fmt.typed_values else "values this server does not hold to a grammar"
            raise InvalidRequest(
                f"tool {tool.name!r}: this model writes tool calls in the {fmt.name} format, whose input is {why}; "
                f"use {'a regex grammar or ' if fmt.typed_values else ''}free text.", param=f"{tool.param}.format", code="unsupported_parameter",
            )


def template_tool(tool: Tool) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "", "parameters": tool_parameters(tool)}}


def call_schema(tool: Tool, args_key: str = "arguments") -> dict[str, Any]:
    """One call as a JSON object: its name, then its arguments, nothing else."""
    return {"type": "object", "properties": {"name": {"const": tool.name}, args_key: tool_parameters(tool)}, "required": ["name", args_key], "additionalProperties": False}


def inline_schema(schema: dict[str, Any]) -> str:
    """A schema for Lark's %json, laid out as the model is shown JSON (runtime.grammar_spec)."""
    schema = closed_objects(schema)
    schema.setdefault("x-guidance", JSON_OPTIONS)
    return json.dumps(schema)


def calls_schema(toolset: ToolSet, args_key: str = "arguments", listed: bool = True) -> dict[str, Any]:
    """The calls toolset allows now, as one object or a JSON list of them (one item without
    parallel_tool_calls or for a named tool, at most max_tool_calls)."""
    one = [call_schema(tool, args_key) for tool in toolset.callable()]
    item: dict[str, Any] = one[0] if len(one) == 1 else {"anyOf": one}
    if not listed:
        return item
    most = 1 if not toolset.parallel or toolset.forced is not None else toolset.max_calls
    return {"type": "array", "items": item, "minItems": 1, **({"maxItems": most} if most else {})}


def lazy_or_forced(toolset: ToolSet, text_guide: Guide | None, opening: str, body: str, rules: list[str], prefix: str = "") -> Guide:
    """The grammar of a format whose calls start at `opening` (a Lark terminal) and go on as
    `body`: under auto free text (or the text guide's JSON) until the model writes the opening,
    then the calls; when a call is forced the calls alone, their opening prefilled (`prefix`)."""
    if toolset.forcing:
        start = f"start: {body}" if prefix else f"start: {opening} {body}"
    elif text_guide is not None:
        rules = [*rules, f"swy_free: %json {inline_schema(_text_schema(text_guide))}"]
        start = f"start: swy_free | {opening} {body}"
    elif opening.startswith("<["):  # a special token: never text, so free text simply ends where it comes
        rules = [*rules, r"SWY_TEXT: /(.|\n)*/"]
        start = f"start: SWY_TEXT | SWY_TEXT {opening} {body}"
    else:
        rules = [*rules, f"swy_head[lazy]: SWY_TEXT {opening}", r"SWY_TEXT: /(.|\n)*/"]
        start = f"start: SWY_TEXT | swy_head {body}"
    return Guide(kind="lark", definition="\n".join([start, *rules]) + "\n", param="tools", prefix=prefix)


def _text_schema(guide: Guide) -> dict[str, Any]:
    return json.loads(guide.definition) if guide.kind == "json_schema" else {"type": "object"}


def arguments_text(tool: Tool, arguments: Any) -> str:
    """What a parsed call's arguments become: a function's JSON text; a custom tool's input."""
    if tool.kind == "custom":
        value = as_object(arguments)
        if isinstance(value, dict) and isinstance(value.get("input"), str):
            return value["input"]
        return value if isinstance(value, str) else canonical_json(value)
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
