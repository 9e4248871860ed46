"""serve-ray failure behaviour: a replica killed mid-stream gives its client a clean error
(an SSE error event and [DONE], never a hang), other requests go on being served, and the
deployment is whole again once Ray Serve's controller has replaced the replica. On the relay
topology here; test_serving_direct.py runs the same on the direct one (the scenario itself:
tests/support/cluster.py)."""

from __future__ import annotations

from tests.support.cluster import Deployer, kill_mid_stream_and_recover


async def test_killing_a_replica_mid_stream_fails_cleanly_and_recovers(deployer: Deployer) -> None:
    await kill_mid_stream_and_recover(deployer())  # the relay: the ingress ends the stream
