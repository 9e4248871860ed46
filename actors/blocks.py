"""KV-cache block accounting with automatic prefix caching. Pure Python: no torch, no trio.

Owns: which physical KV blocks are free, who holds each block (reference counts), and the
content hash of every full block so that a later request with the same prompt prefix reuses it.

A block's hash chains the hash of the block before it with its own token ids, so a hit on block
i means the whole prefix up to block i matches; a LoRA adapter's chain starts from its own root,
so no two adapters (nor an adapter and the base) share a block. A freed block keeps its hash while it sits in
the free queue; it is only forgotten when the allocator hands it out again, oldest first (LRU).
That makes an idle server a warm prefix cache without any extra memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from runtime.prefix_hash import chain_hash

_NO_HASH = None


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = _NO_HASH
    token_ids: tuple[int, ...] = ()  # kept with the hash so a hash collision can never alias
    # The block (id, generation) this one followed when it was published. A hit must follow
    # the previous hit exactly, so by induction the whole prefix is verified token by token
    # and no chain-hash collision can alias KV computed after a different prefix.
    parent: tuple[int, int] | None = None
    generation: int = 0  # bumped each time the block is handed out again


class HashedSeq(Protocol):
    """What the block manager needs of a sequence to publish its blocks."""

    block_table: list[int]
    num_hashed_blocks: int
    last_block_hash: int | None
    # (id, generation) of the published block holding this sequence's last hashed block: its
    # own, or another's with the same content and parent (then its own copy stays private).
    last_block_ref: tuple[int, int] | None

    @property
    def all_token_ids(self) -> list[int]: ...

    @property
    def prefix_root(self) -> int | None: ...


@dataclass(slots=True)
class BlockManager:
    num_blocks: int
    block_size: int
    blocks: list[Block] = field(init=False)
    # Free blocks in eviction order (oldest first). Dict for O(1) removal on a prefix hit.
    free: OrderedDict[int, None] = field(init=False)
    hash_to_block: dict[int, int] = field(init=False)
    num_prefix_queries: int = 0  # full blocks looked up
    num_prefix_hits: int = 0  # full blocks found

    def __post_init__(self) -> None:
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free = OrderedDict((i, None) for i in range(self.num_blocks))
        self.hash_to_block = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------

    def block_ref(self, block_id: int) -> tuple[int, int]:
        return (block_id, self.blocks[block_id].generation)

    def match_prefix(self, token_ids: list[int], max_tokens: int, root: int | None = None) -> tuple[list[int], int | None]:
        """Take a reference on the longest cached run of full blocks that prefixes `token_ids`.

        Only blocks lying wholly within the first `max_tokens` tokens are considered (the caller
        keeps at least one token to compute, since a step must produce logits). `root`: what
        the chain starts from (a LoRA adapter's salt: its KV is its own; None for the base).
        Returns the block ids and the chain hash of the last one.
        """
        hits: list[int] = []
        prev: int | None = root
        bs = self.block_size
        for start in range(0, max_tokens - bs + 1, bs):
            chunk = tuple(token_ids[start : start + bs])
            self.num_prefix_queries += 1
            h = chain_hash(prev, chunk)
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            expected_parent = (hits[-1], self.blocks[hits[-1]].generation) if hits else _root_parent(root)
            if block.token_ids != chunk or block.parent != expected_parent:
                break
            hits.append(block_id)
            prev = h
        self.num_prefix_hits += len(hits)
        for block_id in hits:
            self._ref(block_id)
        return hits, prev

    def commit_full_blocks(self, seq: "HashedSeq", num_computed: int) -> None:
        """Publish every block of `seq` whose `block_size` tokens all have computed KV.

        `seq.num_hashed_blocks` / `seq.last_block_hash` remember how far this went, so each
        block is hashed once in its life, not once per step.
        """
        bs = self.block_size
        token_ids = seq.all_token_ids
        for i in range(seq.num_hashed_blocks, num_computed // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(seq.last_block_hash if i > 0 else seq.prefix_root, chunk)
            block = self.blocks[seq.block_table[i]]
            parent = seq.last_block_ref if i > 0 else _root_parent(seq.prefix_root)
            published = self.hash_to_block.get(h)
            if published is None:
                block.hash = h
                block.token_ids = chunk
                block.parent = parent
                self.hash_to_block[h] = block.block_id
                seq.last_block_ref = (block.block_id, block.generation)
            else:
                # Another block already holds this content (two requests computed the same
                # prefix at once): keep the first published and chain later blocks to it, so
                # they stay reachable; this sequence's own copy stays private.
                other = self.blocks[published]
                same = other.token_ids == chunk and other.parent == parent
                target = other if same else block
                seq.last_block_ref = (target.block_id, target.generation)
            seq.last_block_hash = h
            seq.num_hashed_blocks = i + 1

    # -- allocation ---------------------------------------------------------------------------

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free)

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self.free):
            raise MemoryError(f"need {num_blocks} KV blocks, {len(self.free)} free")
        out = []
        for _ in range(num_blocks):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None:  # evict its cached content
                if self.hash_to_block.get(block.hash) == block_id:
                    del self.hash_to_block[block.hash]
                block.hash = None
                block.token_ids = ()
                block.parent = None
            block.generation += 1
            block.ref_count = 1
            out.append(block_id)
        return out

    def share(self, block_ids: list[int]) -> None:
        """Take one more reference on blocks another sequence holds (a forked sibling)."""
        for block_id in block_ids:
            self._ref(block_id)

    def free_blocks(self, block_table: list[int]) -> None:
        # Tail blocks first: they are the least likely to be shared, so evict them first.
        for block_id in reversed(block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free[block_id] = None

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1


def _root_parent(root: int | None) -> tuple[int, int] | None:
    """A first block's parent: none for the base model, its chain's root for an adapter (a hash
    collision between two adapters' first blocks still never aliases)."""
    return None if root is None else (-1, root)
