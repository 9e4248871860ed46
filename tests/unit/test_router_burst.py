"""The prefix router honours its load bound in a burst.

`serve-ray --replicas 2`: eight concurrent chat streams whose prompts share their opening (one
chat template) all landed on one replica. Ray asks the router to rank replicas for each
request of a burst before any of them is sent, and the router read its in-flight count from
Ray's queue-length cache, which rises only once a request is sent (and is then overwritten by
the replica's own figure, which does not count requests still on their way): every request
of the burst was ranked against zeros. The router now counts a request when it ranks it
(`runtime.routing.InFlight`). Ray's calls are played here in the order Ray makes them, on
the real `PrefixAffinityRouter`; `InFlight` alone below.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.prefix_hash import block_hashes
from runtime.routing import InFlight, RoutingHint, RoutingPolicy

pytest.importorskip("ray.serve", reason="the router adapter needs the ray extra")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID  # noqa: E402

from api.cluster.router import PrefixAffinityRouter  # noqa: E402

DEPLOYMENT = DeploymentID(name="SwitchyardReplica", app_name="switchyard")
SHARED = list(range(100, 140))  # a chat template's and system prompt's 10 blocks, as the ingress hashes them


def router() -> tuple[PrefixAffinityRouter, list[Any]]:
    r = PrefixAffinityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.REPLICA, use_replica_queue_len_cache=True)
    r.initialize_state()
    replicas = [SimpleNamespace(replica_id=ReplicaID(unique_id=name, deployment_id=DEPLOYMENT), routing_stats={}) for name in ("a", "b")]
    return r, replicas


def request(i: int) -> Any:
    """A pending request as the ingress hands it over: its prompt's block hashes, Ray's ids."""
    hint = RoutingHint(tuple(block_hashes([*SHARED, 200 + i, 201, 202, 203], 4)))
    return SimpleNamespace(kwargs={"routing": hint}, metadata=SimpleNamespace(internal_request_id=f"req-{i}", session_id=""))


def first_choice(r: PrefixAffinityRouter, replicas: list[Any], pending: Any) -> str:
    ranks = asyncio.run(r.choose_replicas(replicas, pending))
    return str(ranks[0][0].replica_id.unique_id)


def test_a_burst_of_eight_is_spread_within_the_bound() -> None:
    r, replicas = router()
    # Eight requests ranked before Ray has sent any (no callback in between), as in a burst.
    picks = [first_choice(r, replicas, request(i)) for i in range(8)]
    bound = RoutingPolicy().bound([SimpleNamespace(load=n) for n in (4, 3)])  # the 8th request's: (7 + 1) / 2 replicas
    assert bound == 7
    assert max(picks.count("a"), picks.count("b")) <= bound and set(picks) == {"a", "b"}, picks
    # The ones that share the preferred replica stop there at the bound: 7, then the other.
    assert sorted([picks.count("a"), picks.count("b")]) == [1, 7], picks


def test_counts_follow_rays_callbacks() -> None:
    r, replicas = router()
    a, b = (rep.replica_id for rep in replicas)
    picks = [first_choice(r, replicas, request(i)) for i in range(3)]
    assert r.in_flight.counts() == {picks[0]: 3}
    # Ray sent request 2 to the other replica of the first rank (it picks the least queued).
    other = b if picks[2] == "a" else a
    r.on_request_routed(request(2), other, None)
    r.on_new_queue_len_info(other, 0)  # the replica's own figure, stale: it cannot lower our count
    assert r.in_flight.counts() == {picks[0]: 2, other.unique_id: 1}
    assert r._load(replicas[0] if other is a else replicas[1], 1).ongoing == 1
    for i, replica in ((0, picks[0]), (1, picks[1]), (2, other.unique_id)):
        r.on_request_completed(a if replica == "a" else b, f"req-{i}")
    assert r.in_flight.counts() == {}
    r.in_flight.reserve("req-9", "a")
    r.on_replica_actor_died(a)
    assert r.in_flight.counts() == {}


def test_an_unsent_reservation_lapses_and_a_late_release_keeps_a_retry() -> None:
    now = [0.0]
    flight = InFlight(unconfirmed_s=30.0, clock=lambda: now[0])
    flight.reserve("r1", "a")
    flight.reserve("r2", "a")
    flight.confirm("r2", "b")
    now[0] = 31.0
    assert flight.counts() == {"b": 1}  # r1 was never sent (cancelled): it no longer counts
    flight.reserve("r3", "a")  # rejected by a, retried: reserved on b meanwhile
    flight.reserve("r3", "b")
    flight.release("r3", "a")  # the rejected attempt's completion comes after the retry's reservation
    assert flight.counts() == {"b": 2}
    flight.release("r3", "b")
    flight.release("r2", "b")
    assert flight.counts() == {}
