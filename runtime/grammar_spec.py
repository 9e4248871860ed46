"""Grammar text for constrained decoding: the one definition of how guided JSON is laid out.

Owns: `JSON_OPTIONS`, closing object schemas to undeclared keys (`closed_objects`), and turning a `Guide` (or a JSON schema) into llguidance grammar text.
Pure: no tokenizer, no torch, no trio, so both sides use it: the API edge checks and inlines
schemas with it (api/http/openai/common/grammars.py), and the tokenizer actor's compiler
(actors/guidance.py) compiles exactly the same text into matchers. Imports llguidance and
runtime.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import llguidance

from runtime.errors import InvalidRequest
from runtime.sampling import Guide

if TYPE_CHECKING:  # a TypedDict only the stubs define
    from llguidance._lib import JsonCompileOptions

# Guided JSON is written the way the model is shown JSON: the tool-call format, the fallback
# tool prompt and the rendered history all use `json.dumps`'s ", " and ": " (as chat
# templates' `tojson` does), and no other whitespace, since a small model given free
# whitespace can wander into endless newlines. A schema that sets its own "x-guidance"
# options keeps them.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# Where a JSON schema holds subschemas: a dict of them, a list of them, or one.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains", "propertyNames")


def closed_objects(schema: Any) -> Any:
    """`schema` with `"additionalProperties": false` on every object schema that declares
    properties and does not say otherwise: generated objects hold only declared keys, as
    vLLM's guided decoding does by default (JSON Schema itself allows any other key, and a
    small model given that freedom wanders into keys it was never asked for). llguidance has
    no option for this (its JSON options are separators, whitespace, coerce_one_of, lenient
    and escapes), so the schema is rewritten. A copy; `const`, `enum` and `default` values
    are left alone (only subschema positions are walked)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(sub) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            out[key] = [closed_objects(sub) for sub in out[key]] if isinstance(out[key], list) else closed_objects(out[key])
    if ("properties" in out or "patternProperties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_schema_grammar(schema: str | dict[str, Any]) -> str:
    """The llguidance grammar for a JSON schema, laid out as JSON_OPTIONS says, objects closed
    to undeclared keys unless the schema allows them (`closed_objects`).

    Raises ValueError / TypeError when `schema` is not a JSON object; it does not check the
    schema itself (LLMatcher.validate_grammar does)."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    return llguidance.LLMatcher.grammar_from_json_schema(closed_objects(schema), defaults=JSON_OPTIONS)


def guide_grammar(guide: Guide) -> str:
    """The llguidance grammar text for a guide (raises InvalidRequest on malformed input)."""
    try:
        if guide.kind == "json_object":
            return json_schema_grammar({"type": "object"})
        if guide.kind == "json_schema":
            return json_schema_grammar(guide.definition or "{}")
        if guide.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(guide.definition)
        if guide.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(guide.definition)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"Invalid {guide.kind}: {exc}", param=guide.param) from exc
    raise InvalidRequest(f"Unknown constraint kind {guide.kind!r}.", param=guide.param)
