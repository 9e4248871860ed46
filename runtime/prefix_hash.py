"""The KV block chain hash: one definition shared by the block manager and the router.

Owns `chain_hash` and `block_hashes`. A block's hash chains the previous block's hash with its
own token ids, so equal hashes at depth i mean equal prefixes up to block i. An image's
placeholder tokens hash as its content hash (`keyed_token_ids`): two prompts with the same
text and different images share no block past the first image token. The KV cache
(actors/blocks.py) keys cached blocks by it; the cluster router (runtime/routing.py, fed by
api/cluster) keys its prefix table by the same values, so "this replica holds that prefix"
means the same thing on both sides.

The hash must be equal in every process: the ingress hashes a prompt, the replica caches
it. Python's `hash` of a tuple of ints is deterministic (no PYTHONHASHSEED salt for ints), but
`hash(None)` is the object's address before Python 3.12, so the first block chains from a fixed
integer root instead of None. Pure Python, stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ROOT = 0x5357_4954_4348  # the "previous hash" of a sequence's first block


def chain_hash(prev_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((ROOT if prev_hash is None else prev_hash, token_ids))


def image_key(content_hash: str) -> int:
    """What an image's placeholder tokens hash as: a negative number (never a token id) drawn
    from the image's content hash, so a block holding image tokens hashes the image too."""
    return -(int(content_hash[:15], 16) + 1)


def keyed_token_ids(token_ids: Sequence[int], mm: Any) -> list[int]:
    """`token_ids` with each image's placeholder tokens replaced by its `image_key`: the prompt
    as the prefix cache and the router hash it. `mm`: runtime.messages.MultiModalPrompt or None."""
    keyed = list(token_ids)
    for image in mm.images if mm is not None else ():
        key = image_key(image.hash)
        for start, length in image.runs:
            keyed[start : start + length] = [key] * length
    return keyed


def block_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None, root: int | None = None) -> list[int]:
    """The chain hashes of the full blocks of `token_ids` (at most `max_blocks` of them), the
    chain started from `root` (a LoRA adapter's: runtime/adapters.py `salt`)."""
    out: list[int] = []
    prev: int | None = root
    count = len(token_ids) // block_size
    if max_blocks is not None:
        count = min(count, max_blocks)
    for i in range(count):
        prev = chain_hash(prev, tuple(token_ids[i * block_size : (i + 1) * block_size]))
        out.append(prev)
    return out
