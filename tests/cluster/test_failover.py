"""serve-ray failure behaviour: a replica killed mid-stream gives its client a clean error
(an SSE error event and [DONE], never a hang), other requests go on being served, and the
deployment is whole again once Ray Serve's controller has replaced the replica. On the relay
topology here; test_serving_direct.py runs the same on the direct one."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import ray
import trio
from ray import serve
from ray.util import list_named_actors

from api.cluster.deploy import APP_NAME, REPLICA_DEPLOYMENT
from tests.cluster.conftest import Cluster, Deployer

REPLICA = "x-switchyard-replica"
LONG = {"model": "tiny", "prompt": "Paged attention keeps keys", "max_tokens": 450, "stream": True, "ignore_eos": True}


def replica_actor(unique_id: str):  # type: ignore[no-untyped-def]
    for entry in list_named_actors(all_namespaces=True):
        if entry["name"].startswith("SERVE_REPLICA::") and entry["name"].endswith(f"#{unique_id}"):
            return ray.get_actor(entry["name"], namespace=entry["namespace"])
    raise AssertionError(f"no actor for replica {unique_id}")


def running_replicas() -> int:
    status = serve.status().applications[APP_NAME].deployments[REPLICA_DEPLOYMENT]
    return status.replica_states.get("RUNNING", 0)


async def test_killing_a_replica_mid_stream_fails_cleanly_and_recovers(deployer: Deployer) -> None:
    await kill_mid_stream_and_recover(deployer())  # the relay: the ingress ends the stream


async def kill_mid_stream_and_recover(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        victim = await fail_mid_stream(http, "doomed", lambda victim: ray.kill(replica_actor(victim), no_restart=True), within=30)

        # Others are served meanwhile; each request is answered (a 503 at worst while the
        # routers learn the replica is gone), none hangs.
        statuses = []
        with trio.fail_after(60):
            for i in range(10):
                r = await http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, headers={"x-session-id": f"s-{i}"})
                statuses.append(r.status_code)
                assert r.status_code in (200, 503), r.text
        assert statuses.count(200) >= 5, statuses

        seen = await whole_again(http, victim)
        print(f"\nkilled replica {victim} mid-stream; next 10 requests {statuses}; replaced, now serving from {sorted(seen)}")


async def whole_again(http: httpx.AsyncClient, victim: str) -> set[str]:
    """Once the controller has replaced `victim`, two replicas serve again, neither of them it."""
    with trio.fail_after(90):
        while running_replicas() < 2:
            await trio.sleep(0.5)
        seen: set[str] = set()
        i = 0
        while len(seen) < 2:
            r = await http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, headers={"x-session-id": f"after-{i}"})
            i += 1
            if r.status_code == 200:
                seen.add(r.headers[REPLICA])
    assert victim not in seen
    return seen


async def fail_mid_stream(http: httpx.AsyncClient, session: str, fault: Callable[[str], object], within: float) -> str:
    """Stream a long completion and, after its third event, `fault(replica id)`: the stream
    must end within `within` s (never a hang) with an error event and [DONE]. The victim."""
    events: list[str] = []
    with trio.fail_after(within):
        async with http.stream("POST", "/v1/completions", json=LONG, headers={"x-session-id": session}) as r:
            assert r.status_code == 200
            victim = r.headers[REPLICA]
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line)
                if len(events) == 3:
                    fault(victim)
    assert events[-1] == "data: [DONE]"
    assert '"code":"replica_failed"' in events[-2], events[-2]
    assert len(events) < 100, "the stream ran to its end: the fault did not land mid-stream"
    return victim
