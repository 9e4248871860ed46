"""What the requests say: chat prompts of an exact token count, and seeded embedding texts.

Chat prompts are raw completion text (no chat template). SmolLM2's tokenizer adds no BOS token,
so the number of ids `tokenizer(text)` gives is the number of prompt tokens the server sees; the
builders below verify that and raise if they cannot hit the count exactly. Two modes:
- "fixed": every request sends the same text. A server with a prefix cache then prefills the
  prompt once and serves every later request's prompt from the cache.
- "unique" (the default of the sweep): the same body text behind a short per-request header
  ("Request 00042."), still exactly N tokens. The header differs in the first tokens, so no
  block of one request's prompt matches another's and every request pays a full prefill, as
  the bare-forward baseline does.
- "grounded": a unique passage, then the start of its copy, so the answer quotes the prompt
  (speculative decoding's n-gram drafts catch that).

Embedding texts: distinct English sentences, one or two per input, built from fixed word lists
with a seeded RNG, the same for a given seed (the server benchmark and the bare loop send the
same texts in the same order).
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Any

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
def load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def default_model_dir() -> Path:
    from runtime.model_store import resolve_model

    _, path = resolve_model(None)
    return Path(path)


def embedding_model_dir() -> Path:
    from runtime.model_store import resolve_model

    _, path = resolve_model(None, task="embeddings")
    return Path(path)


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=True)["input_ids"])


def _fit(tok: Any, head: str, n_tokens: int) -> str:
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


def has_bos(tok: Any) -> bool:
    """Whether the tokenizer inserts a BOS id on its own (SmolLM2's does not)."""
    ids = _encode(tok, "hello")
    return tok.bos_token_id is not None and len(ids) > 0 and ids[0] == tok.bos_token_id


def build_prompts(model_dir: str | Path, count: int, n_tokens: int = PROMPT_TOKENS, mode: str = "unique") -> list[str]:
    """`count` prompts of exactly `n_tokens` tokens each (verified)."""
    tok = load_tokenizer(str(model_dir))
    if mode == "fixed":
        return [_fit(tok, "", n_tokens)] * count
    if mode == "grounded":
        return [_grounded(tok, f"Request {i:05d}. ", n_tokens) for i in range(count)]
    if mode != "unique":
        raise ValueError(f"prompt mode must be 'fixed', 'unique' or 'grounded', not {mode!r}")
    return [_fit(tok, f"Request {i:05d}. ", n_tokens) for i in range(count)]


def _grounded(tok: Any, head: str, n_tokens: int) -> str:
    """A passage, then the start of its copy: the answer quotes its prompt (what speculative
    decoding's n-gram drafts are for), still exactly `n_tokens` ids and unique per request."""
    tail = "\n\nThe same passage again, word for word:\n" + head
    for passage_tokens in range(n_tokens - 12, n_tokens // 2, -1):
        text = _fit(tok, head, passage_tokens) + tail
        if len(_encode(tok, text)) == n_tokens:
            return text
    raise ValueError(f"could not build a grounded prompt of exactly {n_tokens} tokens")


def build_prompt_ids(model_dir: str | Path, n_tokens: int = PROMPT_TOKENS) -> list[int]:
    """The token ids of the fixed prompt (for the bare-forward baseline)."""
    tok = load_tokenizer(str(model_dir))
    ids = _encode(tok, _fit(tok, "", n_tokens))
    assert len(ids) == n_tokens, len(ids)
    return ids


# -- embedding inputs --------------------------------------------------------------------------

_SUBJECTS = [
    "The new library", "Our support team", "A local farmer", "The city council", "My grandmother", "The research group",
    "A small startup", "The hospital", "The train operator", "Most customers", "The museum", "A young engineer",
    "The football club", "Several students", "The weather service", "An independent bakery", "The school board",
    "The airline", "A team of volunteers", "The insurance company",
]
_VERBS = [
    "announced", "reviewed", "repaired", "ordered", "described", "cancelled", "published", "tested", "recommended",
    "compared", "delivered", "rejected", "explained", "updated", "planned", "measured", "discussed", "replaced",
]
_OBJECTS = [
    "a cheaper monthly plan", "the quarterly sales report", "two broken heating pumps", "a faster route to the airport",
    "the results of the water quality survey", "an updated privacy policy", "a set of solar panels", "the summer timetable",
    "a recipe for sourdough bread", "the damaged bridge on the river road", "a new mobile banking app",
    "the annual budget", "a guide to growing tomatoes", "the noise complaints from residents", "an exhibition of old maps",
    "the delayed shipment of laptops", "a vaccination schedule for children", "the rules for parking permits",
]
_PLACES = [
    "in the north of the country", "at the main office", "near the old harbour", "on the company website",
    "during the morning meeting", "in a short video", "at the weekend market", "in the local newspaper",
    "after several complaints", "before the holidays", "for the second time this year", "without any warning",
]
_TAILS = [
    "because the old one had become too expensive", "so that families could plan their trips", "and asked for feedback by Friday",
    "although nobody had requested it", "while the staff were on strike", "after a long debate about costs",
    "to reduce waiting times at the counter", "which surprised many people in town", "and promised more details next month",
    "despite the heavy rain", "as part of a larger plan to save energy", "when the first reports came in",
]
_QUESTIONS = [
    "How do I reset my password if I no longer have access to my email?",
    "What is the difference between a fixed and a variable interest rate?",
    "Which documents do I need to renew my passport?",
    "Can I bring my bicycle on the regional train on weekdays?",
    "Why does my sourdough bread collapse in the oven?",
    "When does the public swimming pool open during the school holidays?",
    "Is it possible to change the delivery address after the order has shipped?",
    "How much water should a tomato plant get in hot weather?",
]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
    if rng.random() < 0.7:
        words.append(rng.choice(_PLACES))
    if rng.random() < 0.5:
        words.append(rng.choice(_TAILS))
    return " ".join(words) + "."


def build_texts(n: int, seed: int = 0) -> list[str]:
    """`n` distinct inputs (a question, or one or two sentences), the same for a given seed."""
    rng = random.Random(seed)
    texts: list[str] = []
    seen: set[str] = set()
    for _ in range(50 * n):
        if len(texts) == n:
            break
        r = rng.random()
        if r < 0.15:
            text = rng.choice(_QUESTIONS) + " " + _sentence(rng)
        elif r < 0.6:
            text = _sentence(rng)
        else:
            text = _sentence(rng) + " " + _sentence(rng)
        if text not in seen:
            seen.add(text)
            texts.append(text)
    if len(texts) < n:
        raise ValueError(f"could not build {n} distinct texts")
    return texts


def batch_texts(texts: list[str], b: int, k: int) -> list[str]:
    """The inputs of request (or bare batch) k at batch size b."""
    return [texts[(k * b + i) % len(texts)] for i in range(b)]
