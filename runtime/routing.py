"""Which replica should serve a request: prefix affinity under bounded load. Pure Python.

Owns the routing policy of a Switchyard cluster (api/cluster/router.py adapts it to Ray
Serve's RequestRouter; nothing here knows Ray, trio or torch):

- `RoutingHint`: what the ingress learnt of a request before routing it: the chain hashes of
  its prompt's full KV blocks (runtime/prefix_hash.py, the cache's own block size) and the
  client's `x-session-id`.
- `PrefixTable`: block hash -> the replica that last received a prompt holding that block,
  bounded (least recently used forgotten first). A replica's KV cache keeps freed blocks
  until it needs the room, so the replica that last saw a prefix is the one most likely to
  still hold it.
- `RoutingPolicy.rank`: the replicas to try, best first: a session's replica, else the one
  holding the prompt's longest known prefix, else the rendezvous replica of its opening blocks,
  each only while within a load bound; else the less loaded of two random replicas.
- `InFlight`: this router's own count of each replica's ongoing requests, part of that load.

docs/scaling-out.md ("Routing") says the same for operators.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

DEFAULT_TABLE_BLOCKS = 1 << 16


@dataclass(frozen=True, slots=True)
class RoutingHint:
    block_hashes: tuple[int, ...] = ()
    session_id: str | None = None


@dataclass(slots=True)
class ReplicaLoad:
    replica_id: str
    ongoing: int = 0  # requests this router has in flight there
    live: int = 0  # the replica's own count of admitted, unfinished requests (all routers)
    kv_usage: float = 0.0  # 0-1: KV blocks in use

    @property
    def load(self) -> int:
        return max(self.ongoing, self.live)


@dataclass(slots=True)
class Decision:
    ranks: list[list[str]]
    reason: str  # session, prefix, affinity, balanced: how the first rank was chosen
    matched_blocks: int = 0


def rendezvous(key: str | int, replica_ids: Sequence[str]) -> str:
    """The replica with the highest hash of (key, replica): stable across processes, and only
    the keys of a replica that leaves move."""

    def score(replica_id: str) -> bytes:
        return hashlib.blake2b(f"{key}|{replica_id}".encode(), digest_size=8).digest()

    return max(replica_ids, key=score)


class PrefixTable:
    """Block hash -> replica id, at most `capacity` entries (least recently used dropped)."""

    def __init__(self, capacity: int = DEFAULT_TABLE_BLOCKS) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def record(self, block_hashes: Sequence[int], replica_id: str) -> None:
        owner = self._owner
        for h in block_hashes:
            owner[h] = replica_id
            owner.move_to_end(h)
        while len(owner) > self.capacity:
            owner.popitem(last=False)

    def longest_match(self, block_hashes: Sequence[int], live: set[str]) -> tuple[str | None, int]:
        """(replica, blocks matched) for the deepest block whose replica is live."""
        for depth in range(len(block_hashes), 0, -1):  # deepest first: usually one lookup hits
            replica = self._owner.get(block_hashes[depth - 1])
            if replica is not None and replica in live:
                return replica, depth
        return None, 0

    def forget(self, replica_id: str) -> None:
        for h in [h for h, r in self._owner.items() if r == replica_id]:
            del self._owner[h]


# Load was once Ray's queue-length cache, which rises only once a request is sent and is then
# overwritten by the replica's own figure, which does not yet count the requests on their way
# to it; a burst of concurrent requests was routed against stale zeros, so the bound never bit
# and all of them went to the one preferred replica. Hence a count taken at routing time.
class InFlight:
    """One router's requests per replica, counted from the moment it ranks a replica first for
    them (`reserve`), moved to the replica the request was actually sent to (`confirm`), and
    released when the request ends (`release`). A reservation never confirmed (the request was
    cancelled before it was sent, which no callback reports) lapses after `unconfirmed_s`."""

    def __init__(self, unconfirmed_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.unconfirmed_s = unconfirmed_s
        self.clock = clock
        self._where: dict[str, tuple[str, float | None]] = {}  # request -> (replica, reserved at; None: confirmed)

    def reserve(self, request_id: str, replica_id: str) -> None:
        self._where[request_id] = (replica_id, self.clock())

    def confirm(self, request_id: str, replica_id: str) -> None:
        self._where[request_id] = (replica_id, None)

    def release(self, request_id: str, replica_id: str) -> None:
        """The request ended on `replica_id` (a retry placed elsewhere since is kept)."""
        if self._where.get(request_id, ("", None))[0] == replica_id:
            del self._where[request_id]

    def forget(self, replica_id: str) -> None:
        for request_id in [r for r, (replica, _) in self._where.items() if replica == replica_id]:
            del self._where[request_id]

    def counts(self) -> dict[str, int]:
        stale = self.clock() - self.unconfirmed_s
        for request_id in [r for r, (_, at) in self._where.items() if at is not None and at < stale]:
            del self._where[request_id]
        out: dict[str, int] = {}
        for replica, _ in self._where.values():
            out[replica] = out.get(replica, 0) + 1
        return out


@dataclass
class RoutingPolicy:
    epsilon: float = 0.25
    slack: int = 2
    max_kv_usage: float = 0.95
    min_match: float = 0.5
    affinity_blocks: int = 8
    table: PrefixTable = field(default_factory=PrefixTable)
    rng: random.Random = field(default_factory=random.Random)

    # The order, as Ray Serve ranks replicas:
    # 1. a session's replica (rendezvous hash of the session id over the live replicas, so every
    #    ingress replica picks the same one without sharing state), while within the load bound;
    # 2. the replica holding the longest known prefix of the prompt, when that prefix is at least
    #    `min_match` of the prompt's blocks (a match on a chat template's opening block alone
    #    would herd every request onto one replica for nothing) and the replica is within bound;
    # 3. for a prompt no replica is known to hold, the rendezvous hash of its block at depth
    #    `affinity_blocks` (or its last full block, if shorter): prompts sharing that many
    #    opening blocks (a tenant's system prompt) meet on one replica from every ingress
    #    replica, without shared state, while prompts that differ early spread out;
    # 4. otherwise (past the bound, or no block to hash) the less loaded of two random replicas.
    # Whatever is chosen is recorded (`routed`), so the next request sharing the prefix follows it.
    def rank(self, hint: RoutingHint | None, loads: Sequence[ReplicaLoad]) -> Decision:
        if not loads:
            return Decision([], "none")
        by_id = {r.replica_id: r for r in loads}
        ids = sorted(by_id)
        bound = self.bound(loads)
        fallback = self.two_choices(loads)

        def within(replica_id: str | None) -> bool:
            r = by_id.get(replica_id) if replica_id is not None else None
            return r is not None and r.load < bound and r.kv_usage < self.max_kv_usage

        def ranked(replica_id: str, reason: str, matched: int = 0) -> Decision:
            return Decision([[replica_id], [r for r in fallback if r != replica_id] or [replica_id]], reason, matched)

        hint = hint or RoutingHint()
        if hint.session_id and within(chosen := rendezvous(hint.session_id, ids)):
            return ranked(chosen, "session")
        if hint.block_hashes:
            matched_id, depth = self.table.longest_match(hint.block_hashes, set(ids))
            if matched_id is not None and depth and depth >= self.min_match * len(hint.block_hashes) and within(matched_id):
                return ranked(matched_id, "prefix", depth)
            key = hint.block_hashes[min(self.affinity_blocks, len(hint.block_hashes)) - 1]
            if within(chosen := rendezvous(key, ids)):
                return ranked(chosen, "affinity")
        return Decision([fallback], "balanced")

    # Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): a preferred
    # replica is taken only while its load is below `(1 + epsilon)` times the mean load (counting
    # this request) plus `slack`, and its KV cache is below `max_kv_usage`. Load is the larger of
    # this router's own count of the replica's ongoing requests (exact, immediate, but blind to
    # other ingress replicas) and the replica's own live-request figure (global but up to one
    # stats period old).
    def bound(self, loads: Sequence[ReplicaLoad]) -> float:
        mean = (sum(r.load for r in loads) + 1) / len(loads)
        return math.ceil((1 + self.epsilon) * mean) + self.slack

    def two_choices(self, loads: Sequence[ReplicaLoad]) -> list[str]:
        """Two random replicas, the less loaded (then the emptier cache) first."""
        pair = self.rng.sample(list(loads), min(2, len(loads)))
        pair.sort(key=lambda r: (r.load, r.kv_usage))
        return [r.replica_id for r in pair]

    def routed(self, hint: RoutingHint | None, replica_id: str) -> None:
        """The request went to `replica_id`: its prompt's blocks will be cached there."""
        if hint is not None and hint.block_hashes:
            self.table.record(hint.block_hashes, replica_id)

    def forget(self, replica_id: str) -> None:
        self.table.forget(replica_id)
