"""Prefix-aware routing earns its keep: on a multi-tenant shared-prefix workload, more of the
prompt tokens are served from the replicas' prefix caches with the prefix router (through two
ingress replicas, which read the prompt) than with power of two choices (on the direct
topology: Ray's proxy calls the replicas, api/cluster/deploy.py).

The caches are small on purpose (tests.support.servers.tiny_config: 256 blocks of 4 tokens per
replica): 12 tenants' system prompts do not all fit in one replica's cache, but half of them
do. Power of two sends every tenant everywhere, so each replica churns through all of them;
the prefix router keeps each tenant on one replica. The figures are printed.
"""

from __future__ import annotations

import httpx
import trio

from ops.harness.prefix_mix import HitRate, requests
from tests.support.cluster import Cluster, Deployer

TENANTS, COUNT, SYSTEM_WORDS, CONCURRENCY = 12, 96, 10, 2  # c=4 measured 12-21 points apart, c=2 about 20


async def run_mix(cluster: Cluster) -> HitRate:
    bodies = iter(requests(TENANTS, COUNT, SYSTEM_WORDS, seed=1, model="tiny"))
    result = HitRate()
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:

        async def worker() -> None:
            for body in bodies:
                r = await http.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                result.add(r.json()["usage"])

        with trio.fail_after(180):
            async with trio.open_nursery() as nursery:
                for _ in range(CONCURRENCY):
                    nursery.start_soon(worker)
    return result


async def test_prefix_router_beats_power_of_two_on_shared_prefixes(deployer: Deployer) -> None:
    prefix = await run_mix(deployer())  # caches warm with other tests' prompts: no help here
    pow2 = await run_mix(deployer(router="pow2"))  # redeployed: cold caches
    print(
        f"\nshared-prefix mix ({TENANTS} tenants, {COUNT} requests, c={CONCURRENCY}, 2 replicas; prefix: 2 ingress, pow2: direct): "
        f"prefix-cache hit rate {prefix.rate:.1%} with the prefix router, {pow2.rate:.1%} with power of two "
        f"({prefix.cached_tokens}/{prefix.prompt_tokens} vs {pow2.cached_tokens}/{pow2.prompt_tokens} prompt tokens)"
    )
    assert prefix.requests == pow2.requests == COUNT
    assert prefix.rate > pow2.rate + 0.08, (prefix.rate, pow2.rate)
