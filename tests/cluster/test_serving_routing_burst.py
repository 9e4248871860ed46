"""A burst through the prefix router stays within its load bound.

`serve-ray --replicas 2` (one ingress): eight concurrent chat streams whose prompts share their
opening all went to one replica, past the README's bound (1.25 x the mean + 2: at most 7 of
8 on one of two replicas), because the router ranked every request of the burst before Ray
had counted any of them as sent. The router now counts a request when it ranks it
(tests/unit/test_router_burst.py plays Ray's calls; this is the deployment itself).
"""

from __future__ import annotations

from collections import Counter

import httpx
import trio

from tests.support.cluster import Deployer

REPLICA = "x-switchyard-replica"
SYSTEM = "You are a careful storyteller who writes short stories for children about animals, trains and the sea, in plain words."


async def test_eight_concurrent_streams_are_spread_within_the_bound(deployer: Deployer) -> None:
    cluster = deployer(ingress_replicas=1)  # as `serve-ray --replicas 2`: one ingress, one router
    served: list[str] = []
    started = trio.Event()

    async def stream(http: httpx.AsyncClient, i: int) -> None:
        body = {
            "model": "tiny", "max_tokens": 48, "ignore_eos": True, "stream": True, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{i} story"}],
        }  # fmt: skip
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            served.append(r.headers[REPLICA])
            if len(served) == 8:
                started.set()
            await started.wait()  # all eight in flight at once
            await r.aread()

    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=120, limits=httpx.Limits(max_connections=16)) as http:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(stream, http, i)
    counts = Counter(served)
    assert len(served) == 8
    assert len(counts) == 2 and max(counts.values()) <= 7, counts
