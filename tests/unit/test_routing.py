"""runtime/routing.py and runtime/prefix_hash.py: the cluster's routing policy, no Ray."""

from __future__ import annotations

import random
import subprocess
import sys

from runtime.prefix_hash import block_hashes, chain_hash
from runtime.routing import PrefixTable, ReplicaLoad, RoutingHint, RoutingPolicy, rendezvous


def loads(**live: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(name, live=n) for name, n in live.items()]


def test_block_hashes_chain_like_the_cache() -> None:
    ids = list(range(10))
    hashes = block_hashes(ids, 4)
    assert len(hashes) == 2  # the partial third block is not hashed
    assert hashes[0] == chain_hash(None, (0, 1, 2, 3))
    assert hashes[1] == chain_hash(hashes[0], (4, 5, 6, 7))
    assert block_hashes(ids, 4, max_blocks=1) == hashes[:1]


def test_hashes_agree_across_processes() -> None:
    """The ingress hashes, the replica caches: another interpreter must get the same values
    (hash(None) differs per process before Python 3.12, so the chain has a fixed root)."""
    code = "from runtime.prefix_hash import block_hashes; print(block_hashes(list(range(12)), 4))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(block_hashes(list(range(12)), 4))


def test_prefix_match_prefers_the_replica_that_saw_the_prefix() -> None:
    policy = RoutingPolicy(rng=random.Random(0))
    hashes = tuple(block_hashes(list(range(40)), 4))
    policy.routed(RoutingHint(hashes[:6]), "b")
    decision = policy.rank(RoutingHint(hashes), loads(a=0, b=0, c=0))
    assert decision.ranks[0] == ["b"] and decision.reason == "prefix" and decision.matched_blocks == 6
    assert "b" not in decision.ranks[1]


def test_a_short_shared_opening_does_not_herd() -> None:
    """Every chat prompt shares the template's first block; matching on it alone would send
    every request to whichever replica saw one last."""
    policy = RoutingPolicy(rng=random.Random(0))
    picks = []
    for i in range(40):
        hashes = tuple(block_hashes([1, 2, 3, 4, 5 + i, 6, 7, 8, 9, 10, 11, 12], 4))
        decision = policy.rank(RoutingHint(hashes), loads(a=0, b=0))
        assert decision.reason == "affinity"
        picks.append(decision.ranks[0][0])
        policy.routed(RoutingHint(hashes), picks[-1])
    assert 10 <= picks.count("a") <= 30, picks


def test_new_prompts_sharing_their_opening_meet_from_any_router() -> None:
    """Two ingress replicas, each with its own empty table, send one tenant to one replica."""
    system = list(range(100, 140))  # 10 blocks of a tenant's system prompt
    picks = set()
    for seed in range(6):
        question = [200 + seed, 201, 202, 203]
        hint = RoutingHint(tuple(block_hashes(system + question, 4)))
        picks.add(RoutingPolicy(rng=random.Random(seed)).rank(hint, loads(a=0, b=0, c=0)).ranks[0][0])
    assert len(picks) == 1


def test_affinity_respects_the_bound() -> None:
    hint = RoutingHint(tuple(block_hashes(list(range(40)), 4)))
    target = RoutingPolicy().rank(hint, loads(a=0, b=0)).ranks[0][0]
    busy = loads(**{target: 20, ("b" if target == "a" else "a"): 0})
    assert RoutingPolicy().rank(hint, busy).reason == "balanced"


def test_session_is_sticky_and_stable() -> None:
    policy = RoutingPolicy()
    first = policy.rank(RoutingHint(session_id="conv-1"), loads(a=1, b=1)).ranks[0]
    for _ in range(10):
        assert policy.rank(RoutingHint(session_id="conv-1"), loads(a=1, b=1)).ranks[0] == first


def test_overloaded_preferred_replica_falls_back_to_two_choices() -> None:
    policy = RoutingPolicy(epsilon=0.25, slack=1, rng=random.Random(1))
    hashes = tuple(block_hashes(list(range(16)), 4))
    policy.routed(RoutingHint(hashes), "a")
    decision = policy.rank(RoutingHint(hashes), loads(a=20, b=0))
    assert decision.reason == "balanced" and decision.ranks == [["b", "a"]]


def test_full_kv_cache_is_not_preferred() -> None:
    policy = RoutingPolicy()
    hashes = tuple(block_hashes(list(range(16)), 4))
    policy.routed(RoutingHint(hashes), "a")
    full = [ReplicaLoad("a", kv_usage=0.99), ReplicaLoad("b")]
    assert policy.rank(RoutingHint(hashes), full).reason != "prefix"


def test_dead_replica_is_forgotten_and_never_ranked() -> None:
    policy = RoutingPolicy()
    hashes = tuple(block_hashes(list(range(16)), 4))
    policy.routed(RoutingHint(hashes), "gone")
    decision = policy.rank(RoutingHint(hashes), loads(a=0, b=0))
    assert all("gone" not in rank for rank in decision.ranks)
    policy.forget("gone")
    assert len(policy.table) == 0


def test_table_is_bounded_lru() -> None:
    table = PrefixTable(capacity=3)
    table.record([1, 2, 3], "a")
    table.record([4], "b")
    assert len(table) == 3 and table.longest_match([1], {"a", "b"}) == (None, 0)
    assert table.longest_match([2, 3, 4], {"a", "b"}) == ("b", 3)


def test_rendezvous_moves_only_the_leavers_keys() -> None:
    keys = range(200)
    before = {k: rendezvous(k, ["a", "b", "c"]) for k in keys}
    after = {k: rendezvous(k, ["a", "b"]) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "c")
