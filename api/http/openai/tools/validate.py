"""Declared tools, checked: `build_toolset` from either API's `tools` and `tool_choice`.

Owns: the limits (the Databricks Foundation Model API: at most 32 functions, 15 properties
each), tool names, schemas and grammars compiled by llguidance (through common/grammars.py) so
a bad one is a 400 naming the field, and tool_choice naming a declared tool. Each endpoint's
params.py calls it once per request. Imports api.http.openai.common, api.http.openai.tools and
runtime.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from api.http.openai.common import grammars
from api.http.openai.tools.spec import Tool, ToolSet
from runtime.errors import InvalidRequest

MAX_TOOLS = 32  # the Databricks reference: at most 32 functions
MAX_PROPERTIES = 15  # the Databricks reference: a function's parameters have at most 15 properties
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def build_toolset(
    tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None, max_calls: int | None = None
) -> ToolSet | None:
    """Validate `tools` and `tool_choice` (either API's shapes); None when there are no tools.

    Raises InvalidRequest naming the field: unknown tool types, bad names, duplicates, more
    than 32 tools or 15 properties, schemas or grammars llguidance cannot compile, and a
    tool_choice naming a tool that is not declared.
    """
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice needs tools.", param="tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"At most {MAX_TOOLS} tools are allowed; got {len(tools)}.", param="tools")
    parsed: list[Tool] = []
    for i, raw in enumerate(tools):
        tool = _parse_tool(raw, f"tools[{i}]")
        if any(t.name == tool.name for t in parsed):
            raise InvalidRequest(f"Two tools are named {tool.name!r}.", param=f"tools[{i}].name")
        parsed.append(tool)
    toolset = ToolSet(tuple(parsed), parallel=True if parallel is None else parallel, max_calls=max_calls)
    return _with_choice(toolset, tool_choice)


def _parse_tool(raw: Any, param: str) -> Tool:
    if not isinstance(raw, dict):
        raise InvalidRequest("A tool must be an object.", param=param)
    kind = raw.get("type")
    if kind == "function":
        spec = raw["function"] if isinstance(raw.get("function"), dict) else raw  # Chat nests it
        where = f"{param}.function" if spec is not raw else param
        return _function(spec, where)
    if kind == "custom":
        spec = raw["custom"] if isinstance(raw.get("custom"), dict) else raw
        where = f"{param}.custom" if spec is not raw else param
        return _custom(spec, where)
    raise InvalidRequest(f"Tools of type {kind!r} are not supported; use function or custom tools.", param=f"{param}.type")


def _name(spec: dict[str, Any], param: str) -> str:
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest("A tool name must be 1-64 letters, digits, '_' or '-'.", param=f"{param}.name")
    return name


def _function(spec: dict[str, Any], param: str) -> Tool:
    name = _name(spec, param)
    parameters = spec.get("parameters")
    if parameters is not None:
        where = f"{param}.parameters"
        # Arguments are a JSON object (the Databricks reference: "a valid JSON schema object";
        # the call format writes `"arguments": {...}`), so the schema must describe one. A schema
        # without "type" is read as an object schema (the grammar adds the type).
        if not isinstance(parameters, dict):
            raise InvalidRequest(f"tool {name!r}: parameters must be a JSON schema object.", param=where, code="invalid_schema")
        if parameters.get("type", "object") != "object":
            raise InvalidRequest(
                f"tool {name!r}: parameters must be an object schema (\"type\": \"object\"), not type {parameters['type']!r}.",
                param=where,
                code="invalid_schema",
            )
        grammars.check_json_schema(grammars.arguments_schema(parameters), where, f"tool {name!r}")
        properties = parameters.get("properties") or {}
        if len(properties) > MAX_PROPERTIES:
            raise InvalidRequest(
                f"tool {name!r}: at most {MAX_PROPERTIES} properties are allowed; got {len(properties)}.", param=f"{param}.parameters.properties"
            )
    return Tool("function", name, _description(spec, param), parameters, spec.get("strict"))


def _custom(spec: dict[str, Any], param: str) -> Tool:
    name = _name(spec, param)
    fmt = spec.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise InvalidRequest(f"tool {name!r}: format.type must be 'text' or 'grammar'.", param=f"{param}.format.type")
    if fmt["type"] == "text":
        return Tool("custom", name, _description(spec, param), param=param)
    grammar = fmt["grammar"] if isinstance(fmt.get("grammar"), dict) else fmt  # Chat nests it
    syntax, definition = grammar.get("syntax", "lark"), grammar.get("definition")
    if not isinstance(definition, str) or not definition.strip():
        raise InvalidRequest(f"tool {name!r}: a grammar format needs a definition.", param=f"{param}.format.definition")
    grammars.check_grammar(syntax, definition, f"{param}.format.definition", f"tool {name!r}")
    return Tool("custom", name, _description(spec, param), syntax=syntax, definition=definition, param=param)


def _description(spec: dict[str, Any], param: str) -> str | None:
    text = spec.get("description")
    if text is not None and not isinstance(text, str):
        raise InvalidRequest("A tool description must be a string.", param=f"{param}.description")
    return text


def _with_choice(toolset: ToolSet, choice: Any) -> ToolSet:
    if choice is None or choice in ("auto", "none", "required"):
        return replace(toolset, choice=choice or "auto")
    if not isinstance(choice, dict):
        raise InvalidRequest("tool_choice must be auto, none, required or an object.", param="tool_choice")
    kind = choice.get("type")
    if kind == "allowed_tools":  # Responses: {"type": "allowed_tools", "mode", "tools": [...]}
        spec: dict[str, Any] = choice["allowed_tools"] if isinstance(choice.get("allowed_tools"), dict) else choice
        mode = spec.get("mode", "auto")
        names = {(t.get("function") or t.get("custom") or t).get("name") for t in spec.get("tools") or [] if isinstance(t, dict)}
        unknown = [n for n in names if toolset.get(str(n)) is None]
        if mode not in ("auto", "required") or not names or unknown:
            raise InvalidRequest(f"tool_choice.allowed_tools must list declared tools (unknown: {unknown}).", param="tool_choice")
        return replace(toolset, choice=mode, allowed=frozenset(str(n) for n in names))
    if kind not in ("function", "custom"):
        raise InvalidRequest(f"tool_choice type {kind!r} is not supported.", param="tool_choice.type")
    nested: dict[str, Any] = choice[kind] if isinstance(choice.get(kind), dict) else choice  # Chat nests it
    name = nested.get("name")
    tool = toolset.get(name) if isinstance(name, str) else None
    if tool is None or tool.kind != kind:
        raise InvalidRequest(f"tool_choice names {kind} tool {name!r}, which is not in tools.", param="tool_choice")
    return replace(toolset, choice="required", forced=name)
