"""Grammar compilation for constrained decoding (llguidance). No torch, no trio.

Owns: turning a `Guide` into an llguidance matcher for one request; the grammar text itself
comes from runtime/grammar_spec.py, which the API edge validates with. Compiling is done once
per distinct guide and cached; each request gets a cheap `deep_copy()` of the compiled
template. Runs in the tokenizer actor's worker threads (several
at once: llguidance releases the GIL while it compiles), so neither the event loop nor the
device step ever waits on a compilation. An invalid guide raises InvalidRequest naming
`guide.param`.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from typing import Any

import llguidance

from runtime.errors import InvalidRequest
from runtime.grammar_spec import guide_grammar
from runtime.sampling import Guide

_CACHE_SIZE = 256
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
                self._tokenizer = shared_grammar_tokenizer(self._hf_tokenizer, self._vocab_size)
            return self._tokenizer


# One grammar vocabulary per tokenizer and size in a process (models that share a tokenizer: a
# draft and its target; a restarted engine, or another model, that loads the same files: by
# content, the last four): ~0.4 s for a 49k vocabulary, ~1 s for 152k, ~8 s for one with 48k
# added tokens. Immutable once built, so engines on several threads may share it.
_SHARED: weakref.WeakKeyDictionary[Any, dict[int, llguidance.LLTokenizer]] = weakref.WeakKeyDictionary()
_BY_CONTENT: OrderedDict[tuple[str, int], llguidance.LLTokenizer] = OrderedDict()
_SHARED_LOCK = threading.Lock()


def shared_grammar_tokenizer(hf_tokenizer: Any, n_vocab: int) -> llguidance.LLTokenizer:
    with _SHARED_LOCK:  # held while one is built: models that share it build it once
        built = _SHARED.setdefault(hf_tokenizer, {})
        if n_vocab not in built:
            key = (_content_key(hf_tokenizer), n_vocab)
            hit = _BY_CONTENT.get(key) or grammar_tokenizer(hf_tokenizer, n_vocab)
            if key[0]:
                _BY_CONTENT[key] = hit
                _BY_CONTENT.move_to_end(key)
                while len(_BY_CONTENT) > 4:
                    _BY_CONTENT.popitem(last=False)
            built[n_vocab] = hit
        return built[n_vocab]


def _content_key(hf_tokenizer: Any) -> str:
    """What a fast tokenizer is (its vocabulary, merges and added tokens with their flags, and its
    end of text), so two objects loaded from the same files share one grammar vocabulary."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return ""
    digest = hashlib.sha256(backend.to_str().encode())
    digest.update(repr((hf_tokenizer.eos_token_id, sorted((i, str(t), getattr(t, "special", True)) for i, t in hf_tokenizer.added_tokens_decoder.items()))).encode())
    return digest.hexdigest()


def grammar_tokenizer(hf_tokenizer: Any, n_vocab: int) -> llguidance.LLTokenizer:
    """The tokenizer as llguidance reads it, with the model's own idea of which added tokens are
    special: llguidance takes any `<...>`-shaped added token for a special one, which no
    grammar text can match, so a `special: false` token such as Qwen2.5's `<tool_call>` (the
    model's own way of writing that text) would be masked. Such tokens become plain tokens of
    their text here; everything else is what llguidance read."""
    import llguidance.hf

    base = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=n_vocab)
    plain = {i for i, t in getattr(hf_tokenizer, "added_tokens_decoder", {}).items() if not getattr(t, "special", True) and i < n_vocab}
    if not any(base.is_special_token(i) for i in plain):
        return base
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Tokens(hf_tokenizer, base, n_vocab, plain)), n_vocab=n_vocab, eos_token=hf_tokenizer.eos_token_id)


class _Tokens:
    """llguidance's TokenizerWrapper's view of a tokenizer: each token's bytes and which are special."""

    def __init__(self, hf_tokenizer: Any, base: llguidance.LLTokenizer, n_vocab: int, plain: set[int]) -> None:
        self.hf = hf_tokenizer
        self.eos_token_id = hf_tokenizer.eos_token_id
        self.bos_token_id = hf_tokenizer.bos_token_id
        self.tokens = [base.decode_bytes([i]) for i in range(n_vocab)]
        self.special_token_ids = [i for i in range(n_vocab) if base.is_special_token(i) and i not in plain]

    def __call__(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))
