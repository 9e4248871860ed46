"""Synthetic benchmark prompts of an exact token count, checked by re-encoding.

The prompt is raw completion text (no chat template). SmolLM2's tokenizer adds no BOS token, so
the number of ids `tokenizer(text)` gives is the number of prompt tokens the server sees; the
builders below verify that and raise if they cannot hit the count exactly.

Two modes:
- "fixed": every request sends the same text. A server with a prefix cache then prefills the
  prompt once and serves every later request's prompt from the cache.
- "unique" (the default of the sweep): the same body text behind a short per-request header
  ("Request 00042."), still exactly N tokens. The header differs in the first tokens, so no
  block of one request's prompt matches another's and every request pays a full prefill, as
  the bare-forward baseline does.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PROMPT_TOKENS = 128

_BODY = (
    "The harbour town woke slowly under a grey sky. Fishermen checked their nets along the "
    "stone quay while gulls circled above the masts, and the baker on the corner opened his "
    "shutters to let the smell of fresh bread drift into the narrow street. Children ran past "
    "the market stalls, where farmers were unloading crates of apples, cabbages and potatoes "
    "from the hills. At the end of the pier an old lighthouse keeper sat on a wooden bench, "
    "writing in a small notebook about the weather, the tides and the ships that had passed "
    "during the night. Further inland, the railway station was already busy with travellers "
    "carrying suitcases, newspapers and cups of coffee, waiting for the morning train to the "
    "city. A teacher unlocked the school gate, a doctor hurried towards the clinic, and two "
    "students argued about history on the library steps. "
)


@lru_cache(maxsize=4)
def load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def default_model_dir() -> Path:
    from runtime.model_store import resolve_model

    _, path = resolve_model(None)
    return Path(path)


def _encode(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=True)["input_ids"])


def _fit(tok, head: str, n_tokens: int) -> str:
    """`head` + a prefix of the body text that encodes to exactly `n_tokens` ids."""
    text = head + _BODY * (2 + (4 * n_tokens) // max(1, len(_BODY.split())))
    ids = _encode(tok, text)
    if len(ids) < n_tokens:
        raise ValueError(f"body text too short for {n_tokens} tokens")
    # Decode a cut of the ids and re-encode; a cut inside a word can re-tokenize differently,
    # so try a few cut points around n_tokens (bounded).
    for cut in [n_tokens] + [n_tokens + d for d in (-1, 1, -2, 2, -3, 3, -4, 4)]:
        if cut <= 0 or cut > len(ids):
            continue
        candidate = tok.decode(ids[:cut], skip_special_tokens=False)
        if len(_encode(tok, candidate)) == n_tokens:
            return candidate
    raise ValueError(f"could not build a prompt of exactly {n_tokens} tokens (head {head!r})")


def has_bos(tok) -> bool:
    """Whether the tokenizer inserts a BOS id on its own (SmolLM2's does not)."""
    ids = _encode(tok, "hello")
    return tok.bos_token_id is not None and len(ids) > 0 and ids[0] == tok.bos_token_id


def build_prompts(model_dir: str | Path, count: int, n_tokens: int = PROMPT_TOKENS, mode: str = "unique") -> list[str]:
    """`count` prompts of exactly `n_tokens` tokens each (verified)."""
    tok = load_tokenizer(str(model_dir))
    if mode == "fixed":
        return [_fit(tok, "", n_tokens)] * count
    if mode != "unique":
        raise ValueError(f"prompt mode must be 'fixed' or 'unique', not {mode!r}")
    return [_fit(tok, f"Request {i:05d}. ", n_tokens) for i in range(count)]


def build_prompt_ids(model_dir: str | Path, n_tokens: int = PROMPT_TOKENS) -> list[int]:
    """The token ids of the fixed prompt (for the bare-forward baseline)."""
    tok = load_tokenizer(str(model_dir))
    ids = _encode(tok, _fit(tok, "", n_tokens))
    assert len(ids) == n_tokens, len(ids)
    return ids
