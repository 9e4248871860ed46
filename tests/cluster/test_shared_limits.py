"""Per-key rate limits hold for the whole serve-ray deployment, not per replica: with two
ingress replicas and two model replicas, a key limited to N requests a minute gets exactly N
through, whichever replicas its requests land on; another key has its own N."""

from __future__ import annotations

from collections import Counter

import httpx
import trio

from tests.support.cluster import REPLICA, Deployer

LIMIT = 12


async def test_a_keys_limit_holds_across_replicas(deployer: Deployer) -> None:
    cluster = deployer(platform={"api_keys": ("key-a", "key-b"), "requests_per_minute": LIMIT})
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    statuses: Counter[int] = Counter()
    replicas: set[str] = set()
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        assert (await http.post("/v1/completions", json=body)).status_code == 401  # auth still on the replica

        async def send(i: int) -> None:
            # Sessions spread the key's requests over both replicas.
            headers = {"Authorization": "Bearer key-a", "x-session-id": f"s-{i}"}
            r = await http.post("/v1/completions", json=body, headers=headers)
            statuses[r.status_code] += 1
            replicas.add(r.headers.get(REPLICA, "?"))
            if r.status_code == 429:
                assert r.headers["retry-after"] and "Rate limit of 12 requests per minute" in r.json()["error"]["message"]

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(2 * LIMIT):
                    nursery.start_soon(send, i)
        other = await http.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-b"})
    print(f"\n{2 * LIMIT} requests of one key limited to {LIMIT}/min over replicas {sorted(replicas)}: {dict(statuses)}")
    assert statuses == Counter({200: LIMIT, 429: LIMIT}), statuses
    assert len(replicas) == 2, replicas
    assert other.status_code == 200
