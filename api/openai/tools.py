"""Tools for Chat and Responses: what the client declared, what the model is shown, and how
its output is read back as tool calls.

Owns: the tool-call format, `ToolSet` (the declared tools and tool_choice, validated), putting
tools and tool-call history into the prompt, and `ToolCallParser`, which reads calls out of
generated text incrementally so they can be streamed. Imports api.openai.grammars and runtime.

The format the model writes (and is forced to write when a call is required or named):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

for a function: the Hermes format that tool-capable chat templates (Qwen, Hermes, SmolLM3...)
teach. A custom tool's input is plain text, never JSON, so it has a form of its own:

    <tool_call name="apply_patch">
    *** Begin Patch ...
    </tool_call>

Several calls are separated by a newline. JSON is shown and forced with `json.dumps`'s ", " and
": " separators and no other whitespace (`runtime.grammar_spec.JSON_OPTIONS`): the history's
arguments are re-serialized that way, so the model never sees a layout it may not write.

A call names a tool the model may call now, or it is not a call: `<tool_call>` text that names
an undeclared (or, under tool_choice, disallowed) tool is left in the output as plain text,
never turned into a function_call the client would try to dispatch. The grammar makes such text
impossible while enforcement holds; this is the fallback when it does not.

When the chat template takes `tools` (`apply_chat_template(..., tools=...)`), function tools go
to it; otherwise, and for custom tools always, a system-prompt block (`tools_block`) describes
the tools and this format.
Tool results go back to the model as `tool` messages (template) or as
`<tool_response>...</tool_response>` blocks in a user message (fallback).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from api.openai import grammars
from runtime.errors import InvalidRequest

MAX_TOOLS = 32  # seed 001: at most 32 functions
MAX_PROPERTIES = 15  # seed 001: a function's parameters have at most 15 properties
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN, CLOSE = "<tool_call", "</tool_call>"


@dataclass(frozen=True, slots=True)
class Tool:
    kind: str  # "function" | "custom"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a function's JSON schema
    strict: bool | None = None
    syntax: str | None = None  # a custom tool's grammar syntax ("lark", "regex"); None: free text
    definition: str | None = None

    def openai(self) -> dict[str, Any]:
        """The tool as the Responses API echoes it."""
        if self.kind == "function":
            return {"type": "function", "name": self.name, "description": self.description, "parameters": self.parameters, "strict": self.strict}
        fmt: dict[str, Any] = {"type": "text"}
        if self.syntax is not None:
            fmt = {"type": "grammar", "syntax": self.syntax, "definition": self.definition}
        return {"type": "custom", "name": self.name, "description": self.description, "format": fmt}


@dataclass(frozen=True, slots=True)
class ToolSet:
    tools: tuple[Tool, ...]
    choice: str = "auto"  # "auto" | "none" | "required"
    forced: str | None = None  # the tool tool_choice names
    allowed: frozenset[str] | None = None  # tool_choice allowed_tools
    parallel: bool = True
    max_calls: int | None = None  # Responses' max_tool_calls: the grammar allows no more

    def get(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def callable(self) -> tuple[Tool, ...]:
        """The tools the model may call now."""
        if self.choice == "none":
            return ()
        if self.forced is not None:
            return tuple(t for t in self.tools if t.name == self.forced)
        if self.allowed is not None:
            return tuple(t for t in self.tools if t.name in self.allowed)
        return self.tools

    def choice_json(self) -> str | dict[str, Any]:
        if self.forced is not None:
            tool = self.get(self.forced)
            return {"type": tool.kind if tool else "function", "name": self.forced}
        if self.allowed is not None:
            return {"type": "allowed_tools", "mode": self.choice, "tools": [self.get(n).openai() for n in sorted(self.allowed)]}  # type: ignore[union-attr]
        return self.choice


# -- declared tools ----------------------------------------------------------------------------


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
        # Arguments are a JSON object (seed 001: "uno schema JSON valido oggetto"; the call
        # format writes `"arguments": {...}`), so the schema must describe one. A schema
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
        return Tool("custom", name, _description(spec, param))
    grammar = fmt["grammar"] if isinstance(fmt.get("grammar"), dict) else fmt  # Chat nests it
    syntax, definition = grammar.get("syntax", "lark"), grammar.get("definition")
    if not isinstance(definition, str) or not definition.strip():
        raise InvalidRequest(f"tool {name!r}: a grammar format needs a definition.", param=f"{param}.format.definition")
    grammars.check_grammar(syntax, definition, f"{param}.format.definition", f"tool {name!r}")
    return Tool("custom", name, _description(spec, param), syntax=syntax, definition=definition)


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
        spec = choice.get("allowed_tools") if isinstance(choice.get("allowed_tools"), dict) else choice
        mode = spec.get("mode", "auto")
        names = {(t.get("function") or t.get("custom") or t).get("name") for t in spec.get("tools") or [] if isinstance(t, dict)}
        unknown = [n for n in names if toolset.get(str(n)) is None]
        if mode not in ("auto", "required") or not names or unknown:
            raise InvalidRequest(f"tool_choice.allowed_tools must list declared tools (unknown: {unknown}).", param="tool_choice")
        return replace(toolset, choice=mode, allowed=frozenset(str(n) for n in names))
    if kind not in ("function", "custom"):
        raise InvalidRequest(f"tool_choice type {kind!r} is not supported.", param="tool_choice.type")
    nested = choice.get(kind) if isinstance(choice.get(kind), dict) else choice  # Chat nests it
    name = nested.get("name")
    tool = toolset.get(name) if isinstance(name, str) else None
    if tool is None or tool.kind != kind:
        raise InvalidRequest(f"tool_choice names {kind} tool {name!r}, which is not in tools.", param="tool_choice")
    return replace(toolset, choice="required", forced=name)


# -- the prompt --------------------------------------------------------------------------------


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders a `tools` argument."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def format_call(kind: str, name: str, text: str) -> str:
    """One call in the tool-call format. `text`: a function's arguments (JSON) or custom input."""
    if kind == "function":
        return f'{OPEN}>\n{{"name": "{name}", "arguments": {text or "{}"}}}\n{CLOSE}'
    return f'{OPEN} name="{name}">\n{text}\n{CLOSE}'


def tools_block(toolset: ToolSet, functions: bool = True) -> str:
    """The system-prompt text that describes the tools and the call format (fallback)."""
    tools = [t for t in toolset.callable() if functions or t.kind == "custom"]
    lines = ["# Tools", "", "You can call these tools:", ""]
    for tool in tools:
        lines.append(f"## {tool.name}")
        if tool.description:
            lines.append(tool.description)
        if tool.kind == "function":
            schema = tool.parameters if tool.parameters is not None else grammars.NO_PARAMETERS
            lines.append(f"Arguments: a JSON object matching this JSON schema: {canonical_json(schema)}")
        elif tool.syntax is not None:
            lines.append(f"Input: plain text matching this {tool.syntax} grammar:\n{tool.definition}")
        else:
            lines.append("Input: plain text.")
        lines.append("")
    lines.append("To call a tool, write exactly:")
    if any(t.kind == "function" for t in tools):
        lines.append(format_call("function", "FUNCTION_NAME", '{"ARGUMENT": "VALUE"}'))
    if any(t.kind == "custom" for t in tools):
        lines.append(format_call("custom", "TOOL_NAME", "THE INPUT, AS PLAIN TEXT"))
    lines.append("Tool results come back inside <tool_response></tool_response>.")
    if toolset.forced is not None:
        lines.append(f"You must call {toolset.forced} now.")
    elif toolset.choice == "required":
        lines.append("You must call at least one tool now.")
    return "\n".join(lines)


def render_conversation(messages: list[dict[str, Any]], toolset: ToolSet | None, template_tools: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages (Chat's shape: assistant `tool_calls`, `tool` messages) ready for the template.

    Returns the messages and the extra chat-template kwargs (`tools` when the template takes
    them). Function tools go to a tool-capable template; everything else (custom tools, or
    all tools when the template cannot take them) goes to a system-prompt block, and the
    history's calls and results are written out in the tool-call format.
    """
    kwargs: dict[str, Any] = {}
    block = ""
    if toolset is not None and toolset.callable():
        functions = [t for t in toolset.callable() if t.kind == "function"]
        if template_tools and functions:
            kwargs["tools"] = [_template_tool(t) for t in functions]
        if not template_tools or len(functions) < len(toolset.callable()):
            block = tools_block(toolset, functions=not template_tools)
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "tool" and not template_tools:
            response = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_responses"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_responses": True})
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            out.append(_assistant(message, template_tools))
        else:
            out.append(dict(message))
    for message in out:
        message.pop("_responses", None)
    if block:
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, kwargs


def _template_tool(tool: Tool) -> dict[str, Any]:
    parameters = tool.parameters if tool.parameters is not None else grammars.NO_PARAMETERS
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "", "parameters": parameters}}


def _assistant(message: dict[str, Any], template_tools: bool) -> dict[str, Any]:
    texts = [message["content"]] if message.get("content") else []
    calls = []
    for call in message["tool_calls"]:
        if call.get("type") == "custom":
            custom = call.get("custom") or {}
            texts.append(format_call("custom", custom.get("name", ""), custom.get("input", "")))
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        if template_tools:
            calls.append({"type": "function", "id": call.get("id"), "function": {"name": function.get("name"), "arguments": _as_object(arguments)}})
        else:
            texts.append(format_call("function", function.get("name", ""), canonical_json(arguments)))
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = "\n".join(texts)
    if calls:
        out["tool_calls"] = calls
    return out


def canonical_json(value: Any) -> str:
    """JSON as the model is shown it and forced to write it (", " and ": ", nothing else);
    a string is re-serialized when it is JSON and kept as it is otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, ensure_ascii=False)


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


# -- reading calls back out of the output ------------------------------------------------------


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(slots=True)
class ToolCall:
    kind: str  # "function" | "custom"
    name: str
    call_id: str = field(default_factory=new_call_id)
    text: str = ""  # arguments (JSON text) or custom input, so far
    complete: bool = False


# Parser events: ("text", str, start) | ("start", ToolCall) | ("delta", ToolCall, str) | ("done", ToolCall);
# `start`: where the text begins in everything fed to the parser (for matching it to tokens).
Event = tuple[Any, ...]
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_NAMED_HEAD = re.compile(r'\s+name\s*=\s*"([^"]*)"\s*$')


class ToolCallParser:
    """Splits streamed output into text and tool calls, holding back only what might still
    turn out to be the start of a call (a partial `<tool_call`) or the end of one.

    Arguments stream as they are generated when the call is in the usual shape (name first);
    otherwise the call is parsed whole once it is closed. Whitespace between calls, and at the
    start of text that follows a call, is dropped. A text event carries where its text starts
    in everything fed so far (so a caller can tell which tokens made it), a call only names
    tools the model may call now (anything else stays text).
    """

    def __init__(self, toolset: ToolSet) -> None:
        self.toolset = toolset
        self.calls: list[ToolCall] = []
        self._names = {t.name for t in toolset.callable()}
        self._buf = ""  # always a suffix of everything fed
        self._fed = 0  # characters fed so far
        self._state = "text"  # text | header | raw | hermes | args | tail
        self._call: ToolCall | None = None
        self._scan = _JsonScanner()
        self._hold = False
        self._ws = ""  # whitespace before a `<tool_call`: dropped if it is a call
        self._head = ""  # the `<tool_call ...>` header of the call being read
        self._after_call = False  # the next text follows a call: its leading whitespace goes

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        self._fed += len(text)
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        """Flush at the end of output; a call cut off (e.g. by max tokens) stays incomplete."""
        events: list[Event] = []
        buf, self._buf = self._buf, ""
        if self._state in ("text", "header"):
            ws = self._ws if self._state == "header" else ""
            self._text(events, ws + buf, self._fed - len(buf) - len(ws), final=True)
        elif self._state == "hermes":
            events += self._whole_hermes(buf, complete=False, start=self._fed - len(buf))
        elif self._call is not None:
            if self._state in ("raw", "args") and buf:
                self._delta(events, buf)
            self._call.complete = self._state == "tail"  # only the closing tag is missing
            if self._hold:
                events.append(("delta", self._call, self._call.text))
            events.append(("done", self._call))
        self._state, self._call = "text", None
        return events

    def _text(self, events: list[Event], text: str, start: int, final: bool = False) -> int:
        """Emit text that starts at `start`, minus the whitespace that follows a call (and, at
        the end, whitespace after calls). Returns how many characters of `text` it used."""
        lead = len(text) - len(text.lstrip()) if self._after_call else 0
        body = text[lead:]
        if not body or (final and self.calls and not body.strip()):
            return len(text) if final else lead
        events.append(("text", body, start + lead))
        self._after_call = False
        return len(text)

    # One transition; False when more input is needed.
    def _step(self, events: list[Event]) -> bool:
        buf = self._buf
        base = self._fed - len(buf)  # where buf starts
        if self._state == "text":
            at = buf.find(OPEN)
            if at < 0:
                keep = _partial_suffix(buf, OPEN)
                body = buf[: len(buf) - keep]
                if body.strip():  # trailing whitespace waits: it may come before a call
                    used = self._text(events, body.rstrip(), base)
                    self._buf = buf[used:]
                return False
            before = buf[:at]
            if before.strip():
                self._text(events, before.rstrip(), base)
            self._ws = before[len(before.rstrip()) :]
            self._buf, self._state = buf[at:], "header"
            return True
        if self._state == "header":
            end = buf.find(">")
            if end < 0:
                if len(buf) > 200:  # not a tool call after all
                    return self._not_a_call(events)
                return False
            head = buf[len(OPEN) : end]
            if head.strip() == "":
                self._head = buf[: end + 1]
                self._buf, self._state = buf[end + 1 :], "hermes"
                return True
            m = _NAMED_HEAD.match(head)
            if m is None or m.group(1) not in self._names:
                return self._not_a_call(events)
            if len(buf) == end + 1:
                return False  # wait for the newline that follows the header
            rest = buf[end + 1 :]
            self._buf, self._state = rest[1:] if rest.startswith("\n") else rest, "raw"
            self._start(events, m.group(1), named=True)
            return True
        if self._state == "raw":
            return self._raw(events)
        if self._state == "hermes":
            m = _HERMES_HEAD.match(buf)
            if m is not None:
                name = json.loads(f'"{m.group(1)}"')
                if name not in self._names:  # the header was text after all; so is the rest
                    head = self._ws + self._head
                    self._text(events, head, base - len(head))
                    self._ws, self._state = "", "text"
                    return True
                self._buf, self._state = buf[m.end() :], "args"
                self._start(events, name, named=False)
                return True
            if CLOSE in buf:
                at = buf.index(CLOSE)
                events += self._whole_hermes(buf[:at], complete=True, start=base)
                self._buf, self._state = buf[at + len(CLOSE) :], "text"
                return True
            return False
        if self._state == "args":
            return self._args(events)
        # tail: after a call's arguments, up to the closing tag
        at = buf.find(CLOSE)
        if at < 0:
            self._buf = buf[len(buf) - _partial_suffix(buf, CLOSE) :]
            return False
        self._finish_call(events)
        self._buf, self._state = buf[at + len(CLOSE) :], "text"
        return True

    def _raw(self, events: list[Event]) -> bool:
        end = "\n" + CLOSE
        at = self._buf.find(end)
        if at < 0 and self._buf.startswith(CLOSE):  # an empty input: "\n" + CLOSE, newline eaten
            at, end = 0, CLOSE
        if at < 0:
            keep = _partial_suffix(self._buf, end)
            ready, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
            if ready:
                self._delta(events, ready)
            return False
        if at:
            self._delta(events, self._buf[:at])
        self._buf, self._state = self._buf[at + len(end) :], "text"
        self._finish_call(events)
        return True

    def _args(self, events: list[Event]) -> bool:
        if not self._scan.started:
            self._buf = self._buf.lstrip()
        used, done = self._scan.feed(self._buf)
        if used:
            self._delta(events, self._buf[:used])
            self._buf = self._buf[used:]
        if done:
            self._state = "tail"
            return True
        return False

    def _start(self, events: list[Event], name: str, named: bool) -> None:
        tool = self.toolset.get(name)
        if tool is None or name not in self._names:  # the callers check first; never under -O either
            raise RuntimeError(f"only callable tools start a call, not {name!r}")
        self._call = ToolCall(tool.kind, name)
        self._scan = _JsonScanner()
        self._hold = tool.kind == "custom" and not named  # a custom input written as JSON: decode at the end
        self._ws = ""
        self.calls.append(self._call)
        events.append(("start", self._call))

    def _delta(self, events: list[Event], text: str) -> None:
        assert self._call is not None
        self._call.text += text
        if not self._hold:
            events.append(("delta", self._call, text))

    def _finish_call(self, events: list[Event]) -> None:
        call = self._call
        assert call is not None
        if self._hold:
            value = _as_object(call.text)
            if isinstance(value, dict) and isinstance(value.get("input"), str):
                value = value["input"]
            if isinstance(value, str):
                call.text = value
            events.append(("delta", call, call.text))
        call.complete = True
        events.append(("done", call))
        self._call = None
        self._after_call = True

    def _whole_hermes(self, body: str, complete: bool, start: int) -> list[Event]:
        """A call not in the streaming-friendly shape: parse it whole, or give it back as text
        (also when it names a tool that may not be called). `start`: where `body` starts."""
        try:
            obj = json.loads(body)
            name = obj["name"]
            arguments = obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str) or name not in self._names:
                raise KeyError(name)
        except (ValueError, KeyError, TypeError):
            events: list[Event] = []
            head = self._ws + self._head
            self._text(events, head + body + (CLOSE if complete else ""), start - len(head))
            return events
        events = []
        self._start(events, name, named=False)
        self._hold = False
        call = self._call
        assert call is not None
        text = arguments if isinstance(arguments, str) and call.kind == "custom" else json.dumps(arguments)
        self._delta(events, text)
        call.complete = complete
        events.append(("done", call))
        self._call = None
        self._after_call = True
        return events

    def _not_a_call(self, events: list[Event]) -> bool:
        base = self._fed - len(self._buf)
        self._text(events, self._ws + OPEN, base - len(self._ws))
        self._ws = ""
        self._buf, self._state = self._buf[len(OPEN) :], "text"
        return True


class _JsonScanner:
    """Finds where one JSON value ends in text that arrives piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escape = False

    def feed(self, text: str) -> tuple[int, bool]:
        """(characters that belong to the value, whether the value is complete)."""
        for i, c in enumerate(text):
            if not self.started:
                if c.isspace():
                    continue
                self.started = True
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1, True
                continue
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                if self.depth == 0:
                    return i, True
                self.depth -= 1
                if self.depth == 0:
                    return i + 1, True
            elif self.depth == 0 and (c in ",\n" or c.isspace()):
                return i, True  # the end of a bare number/true/false/null
        return len(text), False


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


# -- Chat's shapes -----------------------------------------------------------------------------


def chat_tool_call(call: ToolCall) -> dict[str, Any]:
    if call.kind == "custom":
        return {"id": call.call_id, "type": "custom", "custom": {"name": call.name, "input": call.text}}
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.text}}


def chat_message_parts(text: str, toolset: ToolSet) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole output → (content, tool_calls); content is None when only calls were made."""
    parser = ToolCallParser(toolset)
    events = parser.feed(text) + parser.finish()
    content = "".join(e[1] for e in events if e[0] == "text")
    calls = [chat_tool_call(c) for c in parser.calls]
    return (content or None) if calls else content, calls


class ChatDeltas:
    """Streamed output → Chat `delta` objects: `content`, or `tool_calls` entries by index."""

    def __init__(self, toolset: ToolSet) -> None:
        self.parser = ToolCallParser(toolset)
        self._index: dict[str, int] = {}

    @property
    def called(self) -> bool:
        return bool(self.parser.calls)

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(self.parser.feed(text)) if text else []

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(self.parser.finish())

    def _deltas(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, *rest in events:
            if kind == "text":
                out.append({"content": rest[0]})
            elif kind == "start":
                call: ToolCall = rest[0]
                self._index[call.call_id] = len(self._index)
                entry = chat_tool_call(call)
                out.append({"tool_calls": [{"index": self._index[call.call_id], **entry}]})
            elif kind == "delta":
                call, text = rest
                body = {"custom": {"input": text}} if call.kind == "custom" else {"function": {"arguments": text}}
                out.append({"tool_calls": [{"index": self._index[call.call_id], **body}]})
        return out
