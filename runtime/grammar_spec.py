"""Grammar text for constrained decoding: the one definition of how guided JSON is laid out.

Owns: `JSON_OPTIONS` and turning a `Guide` (or a JSON schema) into llguidance grammar text.
Pure: no tokenizer, no torch, no trio, so both sides use it: the API edge checks and inlines
schemas with it (api/openai/grammars.py), and the tokenizer actor's compiler
(actors/guidance.py) compiles exactly the same text into matchers. Imports llguidance and
runtime.
"""

from __future__ import annotations

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


def json_schema_grammar(schema: str | dict[str, Any]) -> str:
    """The llguidance grammar for a JSON schema, laid out as JSON_OPTIONS says.

    Raises ValueError / TypeError when `schema` is not a JSON object; it does not check the
    schema itself (LLMatcher.validate_grammar does)."""
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)


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
