"""BlockManager: allocation and reference counts, hash-chained prefix caching, LRU eviction."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import actors.blocks as blocks_mod
from actors.blocks import BlockManager, chain_hash


@dataclass
class Seq:
    """The minimal HashedSeq."""

    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    last_block_hash: int | None = None
    prefix_root: int | None = None  # a LoRA adapter's salt (runtime/adapters.py)

    @property
    def all_token_ids(self) -> list[int]:
        return self.token_ids


def _check_accounting(bm: BlockManager) -> None:
    """Free queue == blocks with no reference; every published hash maps to a block holding it."""
    free = set(bm.free)
    assert len(free) == len(bm.free)
    for b in bm.blocks:
        assert b.ref_count >= 0
        assert (b.ref_count == 0) == (b.block_id in free), b
    for h, block_id in bm.hash_to_block.items():
        assert bm.blocks[block_id].hash == h
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks


def _computed_seq(bm: BlockManager, tokens: list[int], root: int | None = None) -> Seq:
    """A sequence whose every token has computed KV, with its full blocks published."""
    seq = Seq(list(tokens), prefix_root=root)
    seq.block_table = bm.allocate(bm.blocks_needed(len(tokens)))
    bm.commit_full_blocks(seq, len(tokens))
    return seq


# -- allocation -----------------------------------------------------------------------------------


def test_allocate_and_free_reference_counts() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    assert bm.num_free_blocks == 4 and bm.num_used_blocks == 0
    a = bm.allocate(3)
    assert a == [0, 1, 2]  # oldest free first
    assert [bm.blocks[i].ref_count for i in a] == [1, 1, 1]
    assert bm.num_used_blocks == 3 and bm.can_allocate(1) and not bm.can_allocate(2)
    with pytest.raises(MemoryError):
        bm.allocate(2)
    assert bm.num_used_blocks == 3  # a failed allocation takes nothing
    bm.free_blocks(a)
    assert bm.num_used_blocks == 0
    _check_accounting(bm)
    assert bm.allocate(0) == []


def test_double_free_is_caught() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    a = bm.allocate(1)
    bm.free_blocks(a)
    with pytest.raises(AssertionError):
        bm.free_blocks(a)


def test_blocks_needed_rounds_up() -> None:
    bm = BlockManager(num_blocks=1, block_size=4)
    assert [bm.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_free_releases_tail_blocks_first() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    table = bm.allocate(3)
    bm.free_blocks(table)
    assert list(bm.free) == [2, 1, 0]  # the tail block is the next one handed out


# -- commit_full_blocks -----------------------------------------------------------------------------


def test_commit_publishes_only_full_computed_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = Seq(list(range(10)))
    seq.block_table = bm.allocate(3)
    bm.commit_full_blocks(seq, 3)  # not even one full block computed
    assert seq.num_hashed_blocks == 0 and bm.hash_to_block == {}

    bm.commit_full_blocks(seq, 7)  # block 0 full, block 1 only 3/4 computed
    assert seq.num_hashed_blocks == 1
    h0 = chain_hash(None, (0, 1, 2, 3))
    assert seq.last_block_hash == h0
    assert bm.hash_to_block == {h0: seq.block_table[0]}
    assert bm.blocks[seq.block_table[0]].token_ids == (0, 1, 2, 3)
    assert bm.blocks[seq.block_table[1]].hash is None

    bm.commit_full_blocks(seq, 10)  # block 1 full now; block 2 holds 2 of 4 tokens
    h1 = chain_hash(h0, (4, 5, 6, 7))
    assert seq.num_hashed_blocks == 2 and seq.last_block_hash == h1
    assert bm.hash_to_block == {h0: seq.block_table[0], h1: seq.block_table[1]}
    assert bm.blocks[seq.block_table[2]].hash is None

    bm.commit_full_blocks(seq, 10)  # idempotent
    assert seq.num_hashed_blocks == 2 and len(bm.hash_to_block) == 2
    _check_accounting(bm)


def test_duplicate_content_keeps_the_first_published_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _computed_seq(bm, [1, 2])
    b = _computed_seq(bm, [1, 2])
    h = chain_hash(None, (1, 2))
    assert bm.hash_to_block == {h: a.block_table[0]}
    assert bm.blocks[b.block_table[0]].hash is None  # private
    assert b.last_block_hash == h and b.num_hashed_blocks == 1  # the chain still continues
    # Freeing and reallocating b's private block must not unpublish a's.
    bm.free_blocks(b.block_table)
    bm.allocate(bm.num_free_blocks)
    assert bm.hash_to_block == {h: a.block_table[0]}
    _check_accounting(bm)


# -- prefix matching ---------------------------------------------------------------------------------


def test_prefix_match_across_requests_shares_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _computed_seq(bm, list(range(10)))  # blocks 0, 1 full and published
    prompt = list(range(8)) + [100, 101, 102]
    hits, last = bm.match_prefix(prompt, len(prompt) - 1)
    assert hits == a.block_table[:2]
    assert last == chain_hash(chain_hash(None, (0, 1, 2, 3)), (4, 5, 6, 7))
    assert [bm.blocks[i].ref_count for i in hits] == [2, 2]
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (2, 2)
    bm.free_blocks(a.block_table)
    assert [bm.blocks[i].ref_count for i in hits] == [1, 1]
    assert bm.num_used_blocks == 2
    bm.free_blocks(hits)
    assert bm.num_used_blocks == 0
    _check_accounting(bm)


def test_prefix_match_stops_at_first_difference_and_respects_max_tokens() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _computed_seq(bm, list(range(12)))
    # Differs in block 1: only block 0 matches, even though block 2's tokens are equal.
    other = [0, 1, 2, 3, 4, 99, 6, 7, 8, 9, 10, 11, 12]
    hits, last = bm.match_prefix(other, len(other) - 1)
    assert hits == a.block_table[:1] and last == chain_hash(None, (0, 1, 2, 3))
    bm.free_blocks(hits)
    # max_tokens caps the match to blocks lying wholly inside the first max_tokens tokens.
    same = list(range(12))
    for max_tokens, expected in [(3, 0), (4, 1), (7, 1), (8, 2), (11, 2), (12, 3)]:
        hits, _ = bm.match_prefix(same, max_tokens)
        assert hits == a.block_table[:expected], max_tokens
        bm.free_blocks(hits)
    # No match at all: nothing referenced, last hash None.
    hits, last = bm.match_prefix([7, 7, 7, 7, 7], 4)
    assert (hits, last) == ([], None)
    bm.free_blocks(a.block_table)
    _check_accounting(bm)
    assert bm.num_used_blocks == 0


def test_position_matters_same_tokens_in_another_block_do_not_match() -> None:
    bm = BlockManager(num_blocks=8, block_size=2)
    _computed_seq(bm, [5, 6, 1, 2])  # (1, 2) published as block 1 of a chain
    hits, _ = bm.match_prefix([1, 2, 3], 2)
    assert hits == []


def test_freed_blocks_stay_cached_and_a_match_revives_them() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _computed_seq(bm, [1, 2, 3, 4])
    bm.free_blocks(a.block_table)
    assert bm.num_used_blocks == 0
    hits, _ = bm.match_prefix([1, 2, 3, 4, 5], 4)
    assert hits == a.block_table
    assert bm.num_used_blocks == 2  # taken back out of the free queue
    assert all(bm.blocks[i].ref_count == 1 for i in hits)
    _check_accounting(bm)


def test_lru_eviction_of_cached_free_blocks() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _computed_seq(bm, [1, 2, 3, 4])  # blocks 0, 1
    assert a.block_table == [0, 1]
    bm.free_blocks(a.block_table)  # free queue: 2, 3 (never used), 1 (a's tail), 0 (a's head)
    assert list(bm.free) == [2, 3, 1, 0]

    # Never-used blocks go first: a's cache survives.
    other = bm.allocate(2)
    assert other == [2, 3]
    hits, _ = bm.match_prefix([1, 2, 3, 4, 0], 4)
    assert hits == [0, 1]
    bm.free_blocks(hits)  # free queue: 1, 0 again

    # The next allocation evicts the least recently freed block, a's tail: only the head matches.
    assert bm.allocate(1) == [1]
    assert bm.blocks[1].hash is None and bm.blocks[1].token_ids == ()
    assert len(bm.hash_to_block) == 1
    hits, _ = bm.match_prefix([1, 2, 3, 4, 0], 4)
    assert hits == [0]
    bm.free_blocks(hits)
    bm.free_blocks(other)
    bm.free_blocks([1])
    _check_accounting(bm)


def test_matching_refreshes_recency() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _computed_seq(bm, [1, 2])  # block 0
    b = _computed_seq(bm, [3, 4])  # block 1
    bm.free_blocks(a.block_table)
    bm.free_blocks(b.block_table)  # free: 2, 3, 0 (a), 1 (b)
    hits, _ = bm.match_prefix([1, 2, 9], 2)  # a is used again...
    bm.free_blocks(hits)  # ...and freed after b: b is now older
    bm.allocate(3)  # 2, 3, then the oldest cached: b
    assert bm.match_prefix([3, 4, 9], 2)[0] == []
    assert bm.match_prefix([1, 2, 9], 2)[0] == [0]


# -- hash collisions ---------------------------------------------------------------------------------


def test_hash_collision_on_a_block_is_detected_by_token_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every chunk hashes alike: the token ids kept with the hash are all that tells them apart.
    monkeypatch.setattr(blocks_mod, "chain_hash", lambda prev, chunk: 42)
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _computed_seq(bm, [1, 2])
    assert bm.hash_to_block == {42: a.block_table[0]}
    hits, last = bm.match_prefix([3, 4, 5], 2)
    assert (hits, last) == ([], None)
    assert bm.blocks[a.block_table[0]].ref_count == 1
    hits, _ = bm.match_prefix([1, 2, 5], 2)
    assert hits == a.block_table
    bm.free_blocks(hits)


def test_hash_collision_on_the_prefix_does_not_alias_a_later_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's KV depends on its whole prefix, not only its own tokens.

    Python's hash of an int is the int modulo 2**61 - 1, so `chain_hash(p, chunk)` and
    `chain_hash(q, chunk)` are equal whenever p ≡ q (mod 2**61 - 1): two different prefixes
    whose chain hashes collide that way make every later block with the same tokens collide
    too, and the token-id check only compares the block's own chunk. Simulated here by a
    chain hash that loses the prefix.
    """
    real = blocks_mod.chain_hash
    m = (1 << 61) - 1
    assert real(5, (1, 2)) == real(5 + m, (1, 2))  # the collision this stands in for
    monkeypatch.setattr(blocks_mod, "chain_hash", lambda prev, chunk: real(None, chunk))
    bm = BlockManager(num_blocks=8, block_size=2)
    a = _computed_seq(bm, [1, 2, 7, 8])  # publishes (1, 2) then (7, 8) after [1, 2]
    c = _computed_seq(bm, [5, 6])  # publishes (5, 6)
    # [5, 6, 7, 8]: block 0 is c's, but a's block 1 holds the KV of 7, 8 after 1, 2.
    hits, _ = bm.match_prefix([5, 6, 7, 8, 9], 4)
    assert a.block_table[1] not in hits, "KV computed after prefix [1, 2] reused after prefix [5, 6]"
    assert hits == c.block_table[:1]


def test_blocks_published_after_a_private_duplicate_stay_reachable() -> None:
    """Two requests with the same system prompt computed in the same step.

    Both compute the shared block; a's copy is published, b's stays private. b's next block
    (its own user text) is then published too, and a follow-up of b's conversation must reach
    it: its KV was computed after exactly the tokens the follow-up starts with.
    """
    bm = BlockManager(num_blocks=8, block_size=2)
    a = Seq([1, 2, 3, 4])
    a.block_table = bm.allocate(2)
    b = Seq([1, 2, 5, 6])
    b.block_table = bm.allocate(2)
    bm.commit_full_blocks(a, 4)
    bm.commit_full_blocks(b, 4)
    hits, _ = bm.match_prefix([1, 2, 5, 6, 7], 4)
    assert hits == [a.block_table[0], b.block_table[1]]
    bm.free_blocks(hits)
    bm.free_blocks(a.block_table)
    bm.free_blocks(b.block_table)
    # And once everything is idle (cached in the free queue), the same holds.
    hits, _ = bm.match_prefix([1, 2, 5, 6, 7], 4)
    assert len(hits) == 2


def test_an_adapters_prefix_is_its_own() -> None:
    from runtime.adapters import salt

    bm = BlockManager(num_blocks=16, block_size=4)
    tokens = list(range(1, 10))
    _computed_seq(bm, tokens, salt("a"))
    assert bm.match_prefix(tokens, 8)[0] == []  # the base finds nothing the adapter computed
    assert bm.match_prefix(tokens, 8, salt("b"))[0] == []  # nor does another adapter
    assert len(bm.match_prefix(tokens, 8, salt("a"))[0]) == 2  # the same adapter does
    _computed_seq(bm, tokens)
    assert len(bm.match_prefix(tokens, 8)[0]) == 2 and len(bm.match_prefix(tokens, 8, salt("b"))[0]) == 0
    _check_accounting(bm)
