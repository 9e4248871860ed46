"""`switchyard serve-ray`: build the Ray Serve application and run it until a signal.

Owns the shape of the deployment:

    Ray HTTP proxy ──▶ SwitchyardIngress (ingress_replicas; tokenizes, hashes, relays)
                          │ handle, stream=True, PrefixAffinityRouter (or Ray's power of two)
                          ▼
                       SwitchyardReplica (replicas or autoscaling; a whole node's stack each)
                          │ every write, and a long-poll per replica
                          ▼
                       EndpointConfigActor (one, named, detached: the shared endpoint config)

and the driver's life: join a running cluster (`--address`) or start a local Ray instance,
start Serve's HTTP proxy on --host/--port, deploy, wait for SIGINT/SIGTERM, then shut Serve
down (replicas drain their live requests first). Imports ray and api.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from api.cluster.ingress import SwitchyardIngress
from api.cluster.replica import SwitchyardReplica
from api.cluster.settings import ClusterSpec
from runtime.logging import get_logger

log = get_logger("cluster.deploy")

APP_NAME = "switchyard"
REPLICA_DEPLOYMENT = "SwitchyardReplica"
INGRESS_DEPLOYMENT = "SwitchyardIngress"
INGRESS_MAX_ONGOING = 100_000  # the ingress only relays; the replicas' limits are the real ones
QUIET = {"enable_access_log": False}  # the replica's app writes the access line (http_request)


def build_application(spec: ClusterSpec) -> Any:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from api.cluster.router import PrefixAffinityRouter

    s = spec.settings
    router: dict[str, Any] = {"request_routing_stats_period_s": s.routing_stats_period_s}
    if s.router == "prefix":
        router.update(request_router_class=PrefixAffinityRouter, request_router_kwargs=s.router_kwargs)
    options: dict[str, Any] = dict(
        name=REPLICA_DEPLOYMENT,
        ray_actor_options={"num_cpus": s.replica_cpus, "num_gpus": s.replica_gpus},
        max_ongoing_requests=s.max_ongoing_requests,
        health_check_period_s=s.health_check_period_s,
        health_check_timeout_s=s.health_check_timeout_s,
        graceful_shutdown_timeout_s=s.graceful_shutdown_timeout_s,
        request_router_config=RequestRouterConfig(**router),
        logging_config=QUIET,
    )
    if s.autoscaling:
        options["autoscaling_config"] = s.autoscaling
    else:
        options["num_replicas"] = s.replicas
    replica = serve.deployment(**options)(SwitchyardReplica)
    ingress = serve.deployment(
        name=INGRESS_DEPLOYMENT,
        num_replicas=s.ingress_replicas,
        ray_actor_options={"num_cpus": s.ingress_cpus},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        logging_config=QUIET,
    )(serve.ingress()(SwitchyardIngress))
    return ingress.bind(replica.bind(spec), spec)


def deploy(spec: ClusterSpec, host: str, port: int) -> Any:
    """Start Serve's proxy on host:port (Ray must be initialised) and deploy; the app handle."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    return serve.run(build_application(spec), name=APP_NAME, route_prefix="/")


def run(spec: ClusterSpec, host: str, port: int, address: str | None) -> None:
    import ray
    from ray import serve

    # A local instance without the dashboard: its processes took ~5% of a core here, which
    # on a small machine comes out of the model's steps. A cluster one joins keeps its own.
    ray.init(address=address, ignore_reinit_error=True, **({"include_dashboard": False} if address is None else {}))
    deploy(spec, host, port)
    log.info("serve_ray_ready", url=f"http://{host}:{port}", replicas=spec.settings.autoscaling or spec.settings.replicas, router=spec.settings.router)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    log.info("serve_ray_stopping")

    def shut_down() -> None:
        serve.delete(APP_NAME)  # replicas drain (graceful_shutdown_timeout_s) before they stop
        if address is None:
            serve.shutdown()
            ray.shutdown()

    # Bounded: when the signal went to the whole process group, the local Ray instance's own
    # processes are going down too, and a call to a dead controller would wait forever.
    stopper = threading.Thread(target=shut_down, daemon=True)
    stopper.start()
    stopper.join(spec.settings.graceful_shutdown_timeout_s + 15)
    log.info("serve_ray_stopped", clean=not stopper.is_alive())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
