"""Constrained-decoding guides built at the edge, and their validation.

Owns: the `Guide` for structured outputs (Chat `response_format`, Responses `text.format`),
the object schema a function's arguments follow, embedding a client's Lark grammar under a
namespace (the tool-call grammar itself is tools/grammar.py), and checking every
schema and grammar a client sends by compiling it with llguidance, so a bad one is a 400
naming the field instead of a failure inside the engine. Validation is cached by the text of
the schema or grammar (an agent sends the same tools on every turn), and done off the event
loop (`validated`). Imports llguidance, trio and runtime (runtime/grammar_spec.py: the grammar
text the engine's compiler compiles, so the edge checks exactly what the engine will compile,
with the same `JSON_OPTIONS`).

Grammars are llguidance's Lark dialect. A client's Lark grammar is embedded by renaming all of
its rules and terminals into a namespace of its own (`namespace_lark`), so several tools'
grammars and ours can live in one grammar file without clashing.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import llguidance
import trio

from runtime.errors import InvalidRequest
from runtime.grammar_spec import json_schema_grammar
from runtime.sampling import Guide

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
T = TypeVar("T")
# Requests whose schemas and grammars may be compiling at once, each on a worker thread.
_VALIDATING = trio.CapacityLimiter(2)


# -- validation --------------------------------------------------------------------------------


async def validated(build: Callable[..., T], *args: Any, compiles: bool) -> T:
    """`build(*args)` (a request's parameters), on a worker thread when `compiles`: the request
    has tools or a response format, whose schemas and grammars are checked by compiling them,
    which for one not seen before takes milliseconds to seconds: on the event loop, that
    would stall every other request's stream. Without them it runs here (no thread hop)."""
    if not compiles:
        return build(*args)
    return await trio.to_thread.run_sync(functools.partial(build, *args), limiter=_VALIDATING)


@functools.lru_cache(maxsize=512)
def _grammar_error(grammar: str) -> str:
    return llguidance.LLMatcher.validate_grammar(grammar)


@functools.lru_cache(maxsize=512)
def _schema_error(schema_json: str) -> str:
    try:
        grammar = json_schema_grammar(schema_json)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return _grammar_error(grammar)


def check_json_schema(schema: Any, param: str, what: str) -> str:
    """The schema as JSON text, or InvalidRequest (naming `param`) when llguidance rejects it."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{what}: a JSON schema must be an object.", param=param)
    text = json.dumps(schema)
    error = _schema_error(text)
    if error:
        raise InvalidRequest(f"{what}: invalid JSON schema: {_first_line(error)}", param=param, code="invalid_schema")
    return text


def check_grammar(syntax: str, definition: str, param: str, what: str) -> None:
    if syntax == "lark":
        error = _grammar_error(definition)
    elif syntax == "regex":
        error = _grammar_error(llguidance.LLMatcher.grammar_from_regex(definition))
    else:
        raise InvalidRequest(f"{what}: grammar syntax {syntax!r} is not supported (use 'lark' or 'regex').", param=param)
    if error:
        raise InvalidRequest(f"{what}: invalid {syntax} grammar: {_first_line(error)}", param=param, code="invalid_grammar")


def _first_line(error: str) -> str:
    # llguidance appends a source excerpt with a caret; the first lines say what and where.
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return " ".join(lines[:1]) if lines else error


# -- structured outputs ----------------------------------------------------------------------


def format_guide(kind: Any, schema: Any, param: str, schema_param: str | None = None) -> Guide | None:
    """The guide for a response format: "text" (None), "json_object" or "json_schema"."""
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide(kind="json_object", param=param)
    if kind == "json_schema":
        definition = check_json_schema(schema, schema_param or f"{param}.schema", "json_schema")
        return Guide(kind="json_schema", definition=definition, param=param)
    raise InvalidRequest(f"Unknown format type {kind!r}; use text, json_object or json_schema.", param=f"{param}.type")


# -- tool arguments --------------------------------------------------------------------------


def arguments_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The schema a function's arguments are forced to follow, always an object schema: the
    empty object without parameters, and "type": "object" added to a schema that has no type
    (tools/validate.py refuses any other type)."""
    if parameters is None:
        return NO_PARAMETERS
    return parameters if "type" in parameters else {**parameters, "type": "object"}


# -- embedding a client's Lark grammar ---------------------------------------------------------

_RULE = re.compile(r"_*[a-z][a-z0-9_-]*")
_TERMINAL = re.compile(r"_*[A-Z][A-Z0-9_-]*")
_NAME = re.compile(r"_*[A-Za-z][A-Za-z0-9_-]*")
_IMPORT = re.compile(r"%import\s+([\w.]+?)(?:\.(\w+))?\s*(?:->\s*(\w+)|\(([^)]*)\))?\s*$")


def namespace_lark(text: str, prefix: str) -> str:
    """`text` (a valid llguidance Lark grammar) with every rule and terminal renamed.

    Rules `foo` become `{prefix}foo` and terminals `FOO` become `{PREFIX}FOO`, so `start`
    becomes `{prefix}start`. Strings, regexes, comments, special tokens, inline `%json` /
    `%regex` bodies and rule attributes (`name[lazy, stop="x"]:`) are copied unchanged;
    `%import common.X` becomes `%import common.X -> {PREFIX}X`.
    """
    out: list[str] = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i += 1
            line_start = True
            continue
        if c in " \t\r":
            out.append(c)
            i += 1
            continue
        if c == "#" or text.startswith("//", i):
            j = _line_end(text, i)
        elif c == '"':
            j = _quoted_end(text, i, '"')
            while j < n and text[j] == "i":
                j += 1
        elif c == "/":
            j = _quoted_end(text, i, "/")
            while j < n and text[j] in "imslux":
                j += 1
        elif c == "<":
            j = text.index(">", i) + 1
        elif c == "@":  # a subgrammar reference: not ours to rename
            m = _NAME.match(text, i + 1)
            j = m.end() if m else i + 1
        elif c == "%":
            i, chunk = _directive(text, i, prefix)
            out.append(chunk)
            line_start = False
            continue
        elif (m := _RULE.match(text, i)) or (m := _TERMINAL.match(text, i)):
            out.append(_rename(m.group(), prefix))
            i = m.end()
            if line_start:  # a definition: copy its `[attributes]` as they are
                j = _attributes_end(text, i)
                out.append(text[i:j])
                i = j
            line_start = False
            continue
        else:
            j = i + 1
            if c not in "?!":
                line_start = False
        out.append(text[i:j])
        i = j
    return "".join(out)


def _rename(name: str, prefix: str) -> str:
    return (prefix.upper() if _TERMINAL.fullmatch(name) else prefix) + name


def _line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j


def _quoted_end(text: str, i: int, quote: str) -> int:
    j = i + 1
    while j < len(text) and text[j] != quote:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _json_end(text: str, i: int) -> int:
    """The end of the balanced {...} starting at i (strings may hold braces)."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == '"':
            j = _quoted_end(text, j, '"')
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        j += 1
        if depth == 0:
            return j
    return j


def _attributes_end(text: str, i: int) -> int:
    """After a definition's name: past `.priority` and `[attributes]` when a `:` follows."""
    j = i
    while j < len(text) and text[j] in " \t":
        j += 1
    if j >= len(text) or text[j] != "[":
        return i
    k = j + 1
    while k < len(text) and text[k] != "]":
        k = _quoted_end(text, k, '"') if text[k] == '"' else k + 1
    k += 1
    rest = k
    while rest < len(text) and text[rest] in " \t":
        rest += 1
    return k if rest < len(text) and text[rest] == ":" else i


def _directive(text: str, i: int, prefix: str) -> tuple[int, str]:
    m = re.compile(r"%\w+").match(text, i)
    assert m is not None
    word, j = m.group(), m.end()
    if word == "%import":
        end = _line_end(text, i)
        return end, _rename_import(text[i:end], prefix)
    k = j
    while k < len(text) and text[k] in " \t":
        k += 1
    if k < len(text) and text[k] == "{":  # %json {...}, %regex {...}, %llguidance {...}
        end = _json_end(text, k)
        return end, text[i:end]
    return j, word  # %ignore and the like: what follows is renamed as usual


def _rename_import(line: str, prefix: str) -> str:
    m = _IMPORT.match(line.strip())
    if m is None:
        return line
    module, name, alias, names = m.groups()
    if names is not None:
        items = [x.strip() for x in names.split(",") if x.strip()]
        return "\n".join(f"%import {module}.{x} -> {_rename(x, prefix)}" for x in items)
    if name is None:  # `%import common.WS` parsed as module "common", name "WS"
        return line
    return f"%import {module}.{name} -> {_rename(alias or name, prefix)}"
