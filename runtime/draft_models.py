"""Whether a draft model can draft for its target (--spec-decoding draft), from their files alone.

Owns: `draft_error`, the start-up check the command line runs before any model loads (and
`actors/build.py` again once the embedded default is converted): the flags go together, the
draft model is a directory the native path's Llama-family decoder reads (`native_architectures`,
from actors/runners/native/config.py, passed in: this layer imports no actor), the target is a
text model, and both map token ids to the same tokens (a draft model only ever sees and proposes
ids, so that is what sharing a tokenizer means here). Reads config.json and the tokenizer
files as JSON: no torch, no transformers.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from runtime.config import RuntimeConfig
from runtime.model_store import local_model_dir, model_error, vision_model_type


def draft_error(config: RuntimeConfig, native_architectures: Collection[str]) -> str | None:
    """Why `config` cannot serve with its draft model, in one line naming the flag; None when it can."""
    if config.task == "embeddings":
        return None
    if config.drafter() != "draft":
        if not config.draft_model:
            return None
        if config.spec_decoding == "auto":  # --no-batch-invariant turned auto's drafting off
            return f"--draft-model {config.draft_model!r}: --spec-decoding auto drafts nothing under --no-batch-invariant (--spec-decoding draft drafts anyway)"
        return f"--draft-model {config.draft_model!r} drafts only with --spec-decoding draft or auto (not {config.spec_decoding!r})"
    if not config.draft_model:
        return "--spec-decoding draft needs --draft-model: a smaller Llama-family model with the target's tokenizer (a local Hugging Face directory)"
    error = model_error(config.draft_model, flag="--draft-model")
    if error:
        return error
    target, draft = local_model_dir(config.model, config.task), local_model_dir(config.draft_model)
    if target is not None and vision_model_type(target):
        return f"--spec-decoding draft: the target {config.model!r} is a vision-language model; a draft model drafts for text models only"
    if draft is None:
        return None  # the embedded default, not converted yet: checked again once it is
    architectures = _config(draft).get("architectures") or []
    if len(architectures) != 1 or architectures[0] not in native_architectures:
        return f"--draft-model {config.draft_model!r}: architecture {architectures} is not one the native path runs ({', '.join(sorted(native_architectures))})"
    return _vocabulary_error(config.draft_model, target, draft) if target is not None else None


def _vocabulary_error(name: str, target: Path, draft: Path) -> str | None:
    sizes = _config(target).get("vocab_size"), _config(draft).get("vocab_size")
    if None not in sizes and sizes[0] != sizes[1]:
        return f"--draft-model {name!r}: its vocabulary has {sizes[1]} tokens, the target's {sizes[0]}: a draft model must share the target's tokenizer"
    ours, theirs = _token_ids(target), _token_ids(draft)
    if ours is None or theirs is None or type(ours) is not type(theirs) or ours == theirs:
        return None  # the same, or not to be told apart from these files
    if isinstance(ours, bytes) or isinstance(theirs, bytes):
        return f"--draft-model {name!r}: its tokenizer differs from the target's: a draft model must share the target's tokenizer"
    token = next(t for t in sorted(ours.keys() | theirs.keys()) if ours.get(t) != theirs.get(t))
    return f"--draft-model {name!r}: its tokenizer differs from the target's (token {token!r} is id {theirs.get(token)} there, {ours.get(token)} in the target): a draft model must share the target's tokenizer"


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _token_ids(model_dir: Path) -> dict[str, int] | bytes | None:
    """Token → id, from tokenizer.json (or vocab.json and added_tokens.json); a SentencePiece
    model's bytes; None when the directory has none of them."""
    try:
        if (model_dir / "tokenizer.json").is_file():
            document = json.loads((model_dir / "tokenizer.json").read_text())
            vocab = document.get("model", {}).get("vocab", {})
            ids = {piece[0]: i for i, piece in enumerate(vocab)} if isinstance(vocab, list) else dict(vocab)  # Unigram: [piece, score] in id order
            ids.update({added["content"]: added["id"] for added in document.get("added_tokens", [])})
            return ids
        if (model_dir / "vocab.json").is_file():
            ids = json.loads((model_dir / "vocab.json").read_text())
            added = model_dir / "added_tokens.json"
            return {**ids, **(json.loads(added.read_text()) if added.is_file() else {})}
        if (model_dir / "tokenizer.model").is_file():
            return (model_dir / "tokenizer.model").read_bytes()
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return None
