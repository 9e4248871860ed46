"""`PrefixAffinityRouter`: Ray Serve's RequestRouter for Switchyard replicas.

Owns only the adaptation: Ray Serve calls `choose_replicas` with the live replicas and the
pending request; this reads the request's `RoutingHint` (the `routing=` keyword the ingress
passed on the relay topology: the prompt's KV block hashes and session id; on the direct
topology, where Ray's HTTP proxy runs this router and no one has read the prompt, only the
session: Ray's proxy copies the `x-session-id` header into the request's metadata), each
replica's load (this router's own
count of requests in flight there, taken when it routes them: `runtime.routing.InFlight`, and
the figures the replica last reported through `record_routing_stats`), and returns
`runtime.routing.RoutingPolicy`'s ranks. Ray then sends to the least-queued replica of the first rank with room, and moves down
the ranks only when a rank's replicas are full (max_ongoing_requests).

Each handle owner (each ingress replica) has its own router and its own prefix table; the
rendezvous rules in runtime/routing.py make separate ingress replicas agree on sessions and on
new prefixes without sharing state. Imports ray and runtime.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from runtime.logging import get_logger
from runtime.routing import InFlight, ReplicaLoad, RoutingHint, RoutingPolicy

log = get_logger("cluster.router")


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, **policy: Any) -> None:
        """`policy`: [cluster.router_kwargs] (epsilon, slack, max_kv_usage, min_match, affinity_blocks)."""
        self.policy = RoutingPolicy(**policy)
        self.decisions: dict[str, int] = {}  # reason -> count, for logs and tests
        self.in_flight = InFlight()

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        counts = self.in_flight.counts()
        loads = [self._load(r, counts.get(r.replica_id.unique_id, 0)) for r in candidate_replicas]
        decision = self.policy.rank(hint_of(pending_request), loads)
        self.decisions[decision.reason] = self.decisions.get(decision.reason, 0) + 1
        request_id = _request_id(pending_request)
        if request_id and decision.ranks and decision.ranks[0]:
            # Counted now, before Ray sends it: the next request routed in the same burst
            # already sees it (Ray sends to the first rank's least-queued replica, which
            # on_request_routed confirms).
            self.in_flight.reserve(request_id, decision.ranks[0][0])
        return [[by_id[i] for i in rank if i in by_id] for rank in decision.ranks]

    def _load(self, replica: RunningReplica, in_flight: int) -> ReplicaLoad:
        stats = replica.routing_stats or {}
        queued = self.replica_queue_len_cache.get(replica.replica_id) or 0
        return ReplicaLoad(
            replica.replica_id.unique_id,
            ongoing=max(in_flight, queued),
            live=int(stats.get("live", 0)),
            kv_usage=float(stats.get("kv_usage", 0.0)),
        )

    def on_request_routed(self, pending_request: PendingRequest, replica_id: Any, result: Any) -> None:
        self.policy.routed(hint_of(pending_request), replica_id.unique_id)
        request_id = _request_id(pending_request)
        if request_id:
            self.in_flight.confirm(request_id, replica_id.unique_id)

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self.in_flight.release(internal_request_id, replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.forget(replica_id.unique_id)
        self.in_flight.forget(replica_id.unique_id)


def _request_id(pending_request: PendingRequest | None) -> str:
    """Ray's id of the request, the one on_request_completed names ("" when there is none)."""
    metadata = getattr(pending_request, "metadata", None)
    return str(getattr(metadata, "internal_request_id", "") or "")


def hint_of(pending_request: PendingRequest | None) -> RoutingHint | None:
    if pending_request is None:
        return None
    hint = pending_request.kwargs.get("routing")
    if isinstance(hint, RoutingHint):
        return hint
    # Ray's proxy reads RAY_SERVE_SESSION_ID_HEADER_KEY, whose default is our x-session-id.
    session = getattr(pending_request.metadata, "session_id", "")
    return RoutingHint((), session) if session else None
