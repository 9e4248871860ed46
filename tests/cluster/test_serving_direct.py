"""serve-ray's direct topology (api/cluster/deploy.py): with `router = "pow2"` Ray's HTTP proxy
calls the model replicas themselves, with no SwitchyardIngress between. Everything a client
sees must hold as on the relay: the official openai client's chat and completions cases, SSE
token by token ending with [DONE], a disconnect freeing the replica's blocks (read from its
/metrics), `x-session-id` keeping a conversation on one replica (Ray's proxy hands the
header to the request router, api/cluster/router.py), and a replica killed mid-stream
ending its client's stream with an error event and [DONE] (no ingress does it here: the
guard in Ray's proxy does, api/cluster/proxy_guard.py), then the deployment recovering.

Runs right after test_routing_quality.py, whose last deployment is this same shape (two
replicas, pow2), so the tier pays no extra deployment for it.
"""

from __future__ import annotations

import httpx
import pytest
from ray import serve

# The cases the relay passes (test_basic_serving.py) and one node passes (the openai SDK's),
# here through the direct topology: they take this module's `cluster`.
from tests.support.cluster import REPLICA, Cluster, Deployer, kill_mid_stream_and_recover
from tests.support.cluster_cases import (  # noqa: F401
    test_disconnect_frees_the_replicas_blocks,
    test_sse_arrives_incrementally_and_ends_with_done,
    test_two_replicas_both_serve,
)
from tests.support.openai_cases import (  # noqa: F401
    test_bad_input_gets_400_naming_the_field,
    test_chat_non_streaming,
    test_chat_streaming_matches_non_streaming,
    test_completions_streaming_and_not,
)

INGRESS = "x-switchyard-ingress"


@pytest.fixture
def cluster(deployer: Deployer) -> Cluster:
    """Two replicas, power of two: the direct topology."""
    return deployer(router="pow2")


async def test_the_proxy_calls_the_replicas_and_sessions_stick(cluster: Cluster) -> None:
    from api.cluster.deploy import APP_NAME, INGRESS_DEPLOYMENT, REPLICA_DEPLOYMENT

    deployments = serve.status().applications[APP_NAME].deployments
    assert REPLICA_DEPLOYMENT in deployments and INGRESS_DEPLOYMENT not in deployments, sorted(deployments)
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        for session in ("alice", "bob", "carol"):
            served = set()
            for _ in range(6):
                r = await http.post("/v1/completions", json=body, headers={"x-session-id": session})
                assert r.status_code == 200, r.text
                assert INGRESS not in r.headers  # no ingress relayed it
                served.add(r.headers[REPLICA])
            assert len(served) == 1, (session, served)


async def test_a_replica_killed_mid_stream_ends_cleanly_and_is_replaced(cluster: Cluster) -> None:
    await kill_mid_stream_and_recover(cluster)  # last here: the module after redeploys anyway
