"""A tiny byte-level BPE tokenizer built in memory, for tests that need a real `tokenizers.Tokenizer`.

The vocabulary is the 256 byte-level symbols (so any UTF-8 text encodes, and every non-ASCII
character is split over several tokens) plus a handful of merges, some of which deliberately
span a character boundary inside a multi-byte run (the last byte of one emoji + the first byte
of the next), plus one special token. Deterministic: no training.
"""

from __future__ import annotations

from functools import cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

EOS = "<eos>"

_BYTE_TO_SYMBOL = None


def byte_symbol(b: int) -> str:
    """The byte-level alphabet's printable stand-in for byte `b` (GPT-2's table)."""
    global _BYTE_TO_SYMBOL
    if _BYTE_TO_SYMBOL is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for x in range(256):
            if x not in bs:
                bs.append(x)
                cs.append(256 + n)
                n += 1
        _BYTE_TO_SYMBOL = {b_: chr(c) for b_, c in zip(bs, cs)}
    return _BYTE_TO_SYMBOL[b]


def _sym(text: str) -> str:
    return "".join(byte_symbol(b) for b in text.encode("utf-8"))


def _merges() -> list[tuple[str, str]]:
    smile = _sym("😀")  # F0 9F 98 80
    return [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        (_sym(" "), "w"),
        ("o", "r"),
        ("S", "T"),
        ("ST", "O"),
        ("STO", "P"),
        # é is C3 A9: one token holding both bytes...
        (_sym("é")[0], _sym("é")[1]),
        # ...and one holding the last byte of 😀 and the first byte of the next 😀.
        (smile[3], smile[0]),
    ]


@cache
def build_tiny_tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = _merges()
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


def byte_token_ids(text: str) -> list[int]:
    """One token per UTF-8 byte of `text` (no merges): the worst case for a detokenizer."""
    tok = build_tiny_tokenizer()
    return [tok.token_to_id(byte_symbol(b)) for b in text.encode("utf-8")]
