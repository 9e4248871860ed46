"""serve-ray replica health and scaling, on a live deployment: a replica whose
device step is stuck fails its health check (the runtime's `step_deadline`, Ray's
`health_check_period_s`), is reported unhealthy and replaced, and the client whose stream it
held gets a clean error, never a hang; `[cluster.autoscaling]` reaches Ray Serve's controller;
replica and ingress processes log at the command's level.

The stuck step is injected from the test side, in the replica's own process, by a Ray
worker_process_setup_hook (tests/support/stuck_step.py). Runs last in the tier (file names):
its deployment (the default shape, autoscaled 2..2, the hook in the replicas) is its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import ray
import trio
from ray import serve
from ray.util import list_named_actors

from api.cluster.deploy import APP_NAME, INGRESS_DEPLOYMENT, REPLICA_DEPLOYMENT
from tests.support.cluster import Cluster, Deployer, fail_mid_stream, replica_actor, whole_again
from tests.support.stuck_step import runtime_env

STEP_DEADLINE_S = 1.5  # the runtime's --step-deadline, per model
# Non-default values, so reading them back shows they came from here; min = max keeps the
# replica count still while the other test stalls one.
AUTOSCALING = {"min_replicas": 2, "max_replicas": 2, "target_ongoing_requests": 7, "upscale_delay_s": 4.5, "downscale_delay_s": 321.0}


@pytest.fixture(scope="module")
def stuck_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stuck")


@pytest.fixture
def cluster(deployer: Deployer, stuck_dir: Path) -> Cluster:
    # A stuck replica is killed once graceful_shutdown_timeout_s has passed (its stream cannot end).
    return deployer(
        model={"step_deadline": STEP_DEADLINE_S, "log_level": "warning"}, runtime_env=runtime_env(stuck_dir), autoscaling=AUTOSCALING, graceful_shutdown_timeout_s=2.0
    )


def test_the_autoscaling_table_reaches_ray_serve(cluster: Cluster) -> None:
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()  # the controller's own record
    deployment = details["applications"][APP_NAME]["deployments"][REPLICA_DEPLOYMENT]
    applied = deployment["deployment_config"]["autoscaling_config"]
    assert {key: applied[key] for key in AUTOSCALING} == AUTOSCALING
    assert serve.status().applications[APP_NAME].deployments[REPLICA_DEPLOYMENT].replica_states.get("RUNNING") == 2


def test_replica_and_ingress_processes_log_at_the_commands_level(cluster: Cluster) -> None:
    """--log-level warning (here the models' log_level, which the command sets): each Ray
    worker that hosts a replica or an ingress writes JSON lines on its stderr at warning and
    above only, as `switchyard serve` does; before, it wrote at every level."""

    def probe(instance: object) -> str:  # runs in the replica's own process
        import os

        from runtime.logging import get_logger

        get_logger("test.probe").info("probe_info")
        get_logger("test.probe").warning("probe_warning")
        return os.readlink("/proc/self/fd/2")  # the worker's stderr file: Ray's log

    actors = [e for e in list_named_actors(all_namespaces=True) if e["name"].startswith(f"SERVE_REPLICA::{APP_NAME}#")]
    assert {e["name"].split("#")[1] for e in actors} == {REPLICA_DEPLOYMENT, INGRESS_DEPLOYMENT}, actors
    for entry in actors:
        actor = ray.get_actor(entry["name"], namespace=entry["namespace"])
        stderr = Path(ray.get(actor.__ray_call__.remote(probe), timeout=30)).read_text()
        ours = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]  # Ray adds its own lines
        events = {(line["event"], line["level"]) for line in ours if "event" in line}
        assert ("probe_warning", "warning") in events, stderr[-2000:]
        assert not [e for e in events if e[1] in ("debug", "info")], (entry["name"], sorted(events))


def deployment_status() -> str:
    return str(serve.status().applications[APP_NAME].deployments[REPLICA_DEPLOYMENT].status)


async def health_reason(victim: str) -> str:
    """What the victim's own check_health (the one Ray's controller calls) says; '' if healthy."""
    ref = replica_actor(victim).check_health.remote()
    try:
        await trio.to_thread.run_sync(lambda: ray.get(ref, timeout=10), abandon_on_cancel=True)
    except ray.exceptions.RayError as exc:
        return str(exc).strip().splitlines()[-1]  # the replica's own message, past Ray's traceback
    return ""


@dataclass
class Timeline:
    """Seconds after the victim's step stuck, and what its health check said."""

    start: float = field(default=0.0, repr=False)
    health_failed: float | None = None
    reason: str = ""
    unhealthy: float | None = None  # the controller's verdict: the deployment is UNHEALTHY
    client_error: float | None = None

    def now(self) -> float:
        return round(trio.current_time() - self.start, 1)


async def test_a_stuck_step_is_reported_unhealthy_and_replaced(cluster: Cluster, stuck_dir: Path) -> None:
    seen = Timeline()
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        async with trio.open_nursery() as nursery:

            def stick(victim: str) -> None:
                (stuck_dir / victim).touch()  # the victim's next step never returns
                seen.start = trio.current_time()
                nursery.start_soon(watch, victim, seen)

            victim = await fail_mid_stream(http, "stuck", stick, within=45)
            seen.client_error = seen.now()
            nursery.cancel_scope.cancel()
        assert "a step has been running for" in seen.reason, seen
        assert seen.unhealthy is not None, f"the controller never reported the replica unhealthy: {seen}"
        replaced = await whole_again(http, victim)
    print(f"\nstuck step on {victim}: {seen}; replaced, now serving from {sorted(replaced)}")


async def watch(victim: str, seen: Timeline) -> None:
    """Record when the victim's check_health first failed, and why, and when the controller
    first called the deployment unhealthy."""
    while seen.unhealthy is None:
        if not seen.reason and (reason := await health_reason(victim)):
            seen.health_failed, seen.reason = seen.now(), reason
        if "UNHEALTHY" in deployment_status():
            seen.unhealthy = seen.now()
        await trio.sleep(0.25)
