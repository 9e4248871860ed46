"""Shared endpoint config on serve-ray: a change through any ingress reaches every replica
and persists; an A/B split holds across two ingress replicas. (Concurrent writers: the
config actor's compare-and-set, tests/unit/test_cluster_config_store.py.)"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter

import httpx
import trio

from tests.support.cluster import REPLICA, Deployer


def ab(name: str, a: int) -> dict:
    return {
        "name": name,
        "config": {
            "served_entities": [{"name": "a", "entity_name": "tiny"}, {"name": "b", "entity_name": "tiny"}],
            "traffic_config": {"routes": [{"served_model_name": "a", "traffic_percentage": a}, {"served_model_name": "b", "traffic_percentage": 100 - a}]},
        },
    }


async def versions_by_replica(http: httpx.AsyncClient, name: str, tries: int = 40) -> dict[str, int]:
    """config_version of endpoint `name` as each replica answers it (sessions spread the GETs)."""
    seen: dict[str, int] = {}
    for i in range(tries):
        r = await http.get(f"/api/2.0/serving-endpoints/{name}", headers={"x-session-id": f"probe-{i}"})
        assert r.status_code == 200, r.text
        seen[r.headers[REPLICA]] = int(r.json()["config"]["config_version"])
    return seen


async def test_a_config_change_reaches_every_replica_and_persists(deployer: Deployer) -> None:
    cluster = deployer()
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        r = await http.post("/api/2.0/serving-endpoints", json=ab("shared", 50))
        assert r.status_code == 200, r.text
        r = await http.put("/api/2.0/serving-endpoints/shared/config", json=ab("shared", 90)["config"])
        assert r.status_code == 200, r.text
        with trio.fail_after(10):
            while True:
                seen = await versions_by_replica(http, "shared")
                if len(seen) == 2 and set(seen.values()) == {2}:
                    break
                await trio.sleep(0.1)
        # Either replica now builds on version 2.
        again = await http.put("/api/2.0/serving-endpoints/shared/config", json=ab("shared", 10)["config"])
        assert again.status_code == 200, again.text
    with sqlite3.connect(cluster.state_dir / "serving_endpoints.sqlite3") as db:
        (definition,) = db.execute("SELECT definition FROM serving_endpoints WHERE name = 'shared'").fetchone()
    assert '"config_version":3' in definition


async def test_ab_split_of_1000_requests_across_two_ingress_replicas(deployer: Deployer) -> None:
    """1,000 invocations through two ingress replicas to a 70/30 endpoint land within a
    binomial bound (4 sigma: 700 +- 58); both ingress replicas and both replicas took part."""
    n, sigmas = 1000, 4.0
    cluster = deployer()
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60, limits=httpx.Limits(max_connections=16)) as http:
        assert (await http.post("/api/2.0/serving-endpoints", json=ab("split", 70))).status_code == 200
        with trio.fail_after(10):
            while set((await versions_by_replica(http, "split", 12)).values()) != {1}:
                await trio.sleep(0.1)
        counts: Counter[str] = Counter()
        replicas: Counter[str] = Counter()
        ingresses: Counter[str] = Counter()
        todo = iter(range(n))

        async def worker() -> None:
            for _ in todo:
                r = await http.post("/serving-endpoints/split/invocations", json={"prompt": "Hi", "max_tokens": 1})
                assert r.status_code == 200, r.text
                counts[r.headers["served-model-name"]] += 1
                replicas[r.headers[REPLICA]] += 1
                ingresses[r.headers["x-switchyard-ingress"]] += 1

        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                for _ in range(16):
                    nursery.start_soon(worker)
    bound = sigmas * math.sqrt(n * 0.7 * 0.3)
    print(f"\nA/B over two ingress replicas: {dict(counts)} (700 +- {bound:.0f}); by replica {dict(replicas)}, by ingress {dict(ingresses)}")
    assert sum(counts.values()) == n and abs(counts["a"] - 700) <= bound, counts
    assert len(replicas) == 2 and len(ingresses) == 2, (replicas, ingresses)
