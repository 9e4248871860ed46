"""Grammar compilation for constrained decoding (llguidance). No torch, no trio.

Owns: turning a `Guide` into an llguidance matcher for one request. Compiling is done once per
distinct guide and cached; each request gets a cheap `deep_copy()` of the compiled template.
Runs in the tokenizer actor's worker thread, so neither the event loop nor the device step
ever waits on a compilation. An invalid guide raises InvalidRequest naming `guide.param`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance

from runtime.errors import InvalidRequest
from runtime.sampling import Guide

# Compact JSON: a small model given free whitespace can wander into endless newlines.
_JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
_CACHE_SIZE = 256


def guide_grammar(guide: Guide) -> str:
    """The llguidance grammar text for a guide (raises InvalidRequest on malformed input)."""
    try:
        if guide.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        if guide.kind == "json_schema":
            schema = json.loads(guide.definition) if guide.definition else {}
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
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
    def __init__(self, hf_tokenizer: Any, vocab_size: int) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._templates: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, guide: Guide) -> llguidance.LLMatcher:
        key = (guide.kind, guide.definition)
        with self._lock:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
                return template.deep_copy()
        template = llguidance.LLMatcher(self._ll_tokenizer(), guide_grammar(guide), log_level=0)
        if template.is_error():
            raise InvalidRequest(f"Invalid {guide.kind}: {template.get_error()}", param=guide.param)
        with self._lock:
            self._templates[key] = template
            while len(self._templates) > _CACHE_SIZE:
                self._templates.popitem(last=False)
        return template.deep_copy()

    def warm(self) -> None:
        """Build the llguidance tokenizer now, so the first guided request does not pay for it."""
        self._ll_tokenizer()

    def _ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            import llguidance.hf

            # ~0.4 s for a 49k vocabulary, once per model.
            self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size)
        return self._tokenizer
