"""Grammar compilation for constrained decoding (llguidance). No torch, no trio.

Owns: turning a `Guide` into an llguidance matcher for one request, and `JSON_OPTIONS`, the one
definition of how guided JSON is laid out (api/grammars.py validates and inlines schemas with
it). Compiling is done once per distinct guide and cached; each request gets a cheap
`deep_copy()` of the compiled template. Runs in the tokenizer actor's worker threads (several
at once: llguidance releases the GIL while it compiles), so neither the event loop nor the
device step ever waits on a compilation. An invalid guide raises InvalidRequest naming
`guide.param`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance

from runtime.errors import InvalidRequest
from runtime.sampling import Guide

# Guided JSON is written the way the model is shown JSON: the tool-call format, the fallback
# tool prompt and the rendered history all use `json.dumps`'s ", " and ": " (as chat
# templates' `tojson` does), and no other whitespace, since a small model given free
# whitespace can wander into endless newlines. A schema that sets its own "x-guidance"
# options keeps them.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CACHE_SIZE = 256
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


def validate_guide(guide: Guide) -> str | None:
    """An error message when the guide cannot compile, else None. Needs no tokenizer."""
    try:
        grammar = guide_grammar(guide)
    except InvalidRequest as exc:
        return str(exc)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    return error or None


class GuideCompiler:
    """Compiled guides for one model's vocabulary. Thread-safe: several threads may compile
    at once; two asking for the same uncompiled guide compile it once (the second waits)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._templates: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._compiling: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()  # guards _templates and _compiling
        self._tokenizer_lock = threading.Lock()

    def cached(self, guide: Guide) -> llguidance.LLMatcher | None:
        """A fresh matcher when the guide is already compiled, else None (never compiles)."""
        key = (guide.kind, guide.definition)
        with self._lock:
            template = self._templates.get(key)
            if template is None:
                return None
            self._templates.move_to_end(key)
        return template.deep_copy()

    def matcher(self, guide: Guide) -> llguidance.LLMatcher:
        """A fresh matcher for the guide, compiling it first if need be (slow: call it off the loop)."""
        key = (guide.kind, guide.definition)
        hit = self.cached(guide)
        if hit is not None:
            return hit
        with self._lock:
            lock = self._compiling.setdefault(key, threading.Lock())
        with lock:
            hit = self.cached(guide)  # compiled by the thread we waited for
            if hit is not None:
                return hit
            try:
                template = llguidance.LLMatcher(self._ll_tokenizer(), guide_grammar(guide), log_level=0)
                if template.is_error():
                    raise InvalidRequest(f"Invalid {guide.kind}: {template.get_error()}", param=guide.param)
                with self._lock:
                    self._templates[key] = template
                    while len(self._templates) > _CACHE_SIZE:
                        self._templates.popitem(last=False)
            finally:
                with self._lock:
                    self._compiling.pop(key, None)
        return template.deep_copy()

    def warm(self) -> None:
        """Build the llguidance tokenizer now, so the first guided request does not pay for it."""
        self._ll_tokenizer()

    def _ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                import llguidance.hf

                # ~0.4 s for a 49k vocabulary, once per model.
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size)
            return self._tokenizer
