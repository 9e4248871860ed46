"""`switchyard serve-ray`: build the Ray Serve application and run it until a signal.

Owns the shape of the deployment, one of two topologies (ClusterSettings.direct decides; drawn
beside `build_application`, compared in docs/scaling-out.md, "Two topologies"): relay (Ray's
HTTP proxy -> SwitchyardIngress, which tokenizes, hashes and relays -> SwitchyardReplica), where
routing needs the prompt; direct (proxy -> SwitchyardReplica as its own ASGI app), one process
fewer for every token, where it does not. Every replica shares the EndpointConfigActor. A
replica that dies mid-response: on the relay the ingress ends the response cleanly; on the
direct topology Ray's proxy runs api/cluster/proxy_guard.py, which does the same.

And the driver's life: join a running cluster (`--address`) or start a local Ray instance
(the driver then runs under api/cluster/supervisor.py), start Serve's HTTP proxy on
--host/--port, deploy, wait for SIGINT/SIGTERM, then stop in order: announce the stop (every
replica drains at once, up to --drain-timeout), delete the app while the proxy still carries
the last bytes, then Serve and the local instance. Imports ray and api.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from api.cluster.config_store import announce_stop, forget_config_actor
from api.cluster.ingress import SwitchyardIngress
from api.cluster.proxy_guard import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from api.cluster.replica import SwitchyardReplica
from api.cluster.settings import ClusterSpec
from runtime.logging import get_logger

log = get_logger("cluster.deploy")

APP_NAME = "switchyard"
REPLICA_DEPLOYMENT = "SwitchyardReplica"
INGRESS_DEPLOYMENT = "SwitchyardIngress"
INGRESS_MAX_ONGOING = 100_000  # the ingress only relays; the replicas' limits are the real ones
QUIET = {"enable_access_log": False}  # the replica's app writes the access line (http_request)
# How often a stopping replica checks for requests still running. Ray Serve's default (2 s)
# is slept before the first check, so every stop paid it even with nothing in flight.
DRAIN_POLL_S = 0.2
# Past the replicas' graceful_shutdown_timeout_s: Serve's controller, then the local Ray
# instance's processes going down. Past it the driver exits anyway.
STOP_MARGIN_S = 15.0


def topology(spec: ClusterSpec) -> dict[str, Any]:
    """The deployment's shape in words, for the ready log line and the bench's record."""
    s = spec.settings
    if not s.direct:
        return {"topology": "relay", "hops": "proxy -> ingress -> replica", "ingress_replicas": s.ingress_replicas}
    sessions = "x-session-id sticky, else power of two" if s.routes else "one replica"
    return {"topology": "direct", "hops": "proxy -> replica", "routing": sessions}


# relay (router "prefix" over several replicas: routing needs the prompt)
#
#     Ray HTTP proxy ──▶ SwitchyardIngress (ingress_replicas; tokenizes, hashes, relays)
#                           │ handle, stream=True, PrefixAffinityRouter (or Ray's power of two)
#                           ▼
#                        SwitchyardReplica (replicas or autoscaling; a whole node's stack each)
#                           │ every write, and a long-poll per replica
#                           ▼
#                        EndpointConfigActor (one, named, detached: the shared endpoint config)
#
# direct (router "pow2", or one replica without autoscaling: the prompt is not needed)
#
#     Ray HTTP proxy ──▶ SwitchyardReplica, wrapped by serve.ingress() (its own ASGI app)
#                           │ (proxy's handle; PrefixAffinityRouter with x-session-id only, when
#                           ▼  there is a choice of replica)
#                        EndpointConfigActor
#
# Every token crosses one process fewer on the direct one (the proxy's call reaches the
# replica itself); the ingress's tokenizing and hashing is what the relay pays for.
def build_application(spec: ClusterSpec) -> Any:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from api.cluster.router import PrefixAffinityRouter

    s = spec.settings
    router: dict[str, Any] = {"request_routing_stats_period_s": s.routing_stats_period_s}
    # On the direct topology the proxy's own router picks the replica: the session policy
    # (no prompt hashes there) keeps an x-session-id on one replica, which Ray's pow2 would not.
    if (s.direct and s.routes) or (not s.direct and s.router == "prefix"):
        router.update(request_router_class=PrefixAffinityRouter, request_router_kwargs=s.router_kwargs)
    options: dict[str, Any] = dict(
        name=REPLICA_DEPLOYMENT,
        ray_actor_options={"num_cpus": s.replica_cpus, "num_gpus": s.replica_gpus},
        max_ongoing_requests=s.max_ongoing_requests,
        health_check_period_s=s.health_check_period_s,
        health_check_timeout_s=s.health_check_timeout_s,
        graceful_shutdown_timeout_s=spec.stop_timeout_s,
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
        request_router_config=RequestRouterConfig(**router),
        logging_config=QUIET,
    )
    if s.autoscaling:
        options["autoscaling_config"] = s.autoscaling
    else:
        options["num_replicas"] = s.replicas
    if s.direct:
        return serve.deployment(**options)(serve.ingress()(SwitchyardReplica)).bind(spec)
    replica = serve.deployment(**options)(SwitchyardReplica)
    ingress = serve.deployment(
        name=INGRESS_DEPLOYMENT,
        num_replicas=s.ingress_replicas,
        ray_actor_options={"num_cpus": s.ingress_cpus},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        # An ingress request ends when its replica's does, so the replicas' bound holds here too.
        graceful_shutdown_timeout_s=spec.stop_timeout_s,
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
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

    # A local instance without the dashboard: its processes take a share of a core (docs/
    # performance.md, Ray's "Earlier runs on a shared machine"), which on a small machine
    # comes out of the model's steps. A cluster one joins keeps its own.
    # "local", not None: None would join a cluster `ray start` left running on this host.
    if address is None:  # the instance's processes inherit it: Ray's HTTP proxy loads the guard
        os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    # A local instance gets the CPUs the settings were fitted to (cli.fit_local), so Ray and
    # the sizing count the same machine.
    local: dict[str, Any] = {}
    if address is None:
        local = {"include_dashboard": False, **({"num_cpus": spec.local["cpus"]} if spec.local else {})}
    ray.init(address=address or "local", ignore_reinit_error=True, **local)
    stop = _StopSignal()  # after ray.init, which installs its own SIGTERM handler (sys.exit)
    try:
        with stop.interrupting():  # a signal while Serve deploys (minutes for a big model) stops it
            deploy(spec, host, port)
        settings = spec.settings
        log.info(
            "serve_ray_ready", url=f"http://{host}:{port}", replicas=settings.autoscaling or settings.replicas, router=settings.router,
            replica_cpus=settings.replica_cpus, ingress_cpus=None if settings.direct else settings.ingress_cpus, local_ray=spec.local, **topology(spec),
        )
        stop.wait()
    except _Interrupted:
        pass
    log.info("serve_ray_stopping")
    phases = _shut_down(address is None, spec.stop_timeout_s + STOP_MARGIN_S)
    log.info("serve_ray_stopped", clean=phases.pop("done", False), seconds=round(time.monotonic() - stop.at, 2), **phases)
    # Interpreter finalization with Ray's threads and torch loaded only adds seconds.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _shut_down(local: bool, bound_s: float) -> dict[str, Any]:
    """Stop Serve (its replicas drain first), then the local Ray instance, within `bound_s`
    (a dead controller never answers); the seconds each phase that ended took, and `done`."""
    import ray
    from ray import serve

    phases: dict[str, Any] = {}

    def timed(name: str, step: Any, *args: Any) -> None:
        start = time.monotonic()
        step(*args)
        phases[name] = round(time.monotonic() - start, 2)

    def shut_down() -> None:
        timed("announce", announce_stop)  # every replica starts its drain now, in parallel
        # The app first, with the proxy still up: serve.shutdown kills the proxy at once, which
        # would cut the responses still streaming. Replicas drain, then __del__ stops each runtime.
        timed("app", serve.delete, APP_NAME)
        if local:
            timed("serve", serve.shutdown)  # the proxy and the controller
            timed("ray", ray.shutdown)  # the instance's processes, the detached actors' included
        else:  # a shared cluster: the endpoint state stays in the SQLite file
            forget_config_actor()
        phases["done"] = True

    stopper = threading.Thread(target=shut_down, daemon=True)
    stopper.start()
    stopper.join(bound_s)
    return phases


class _Interrupted(BaseException):  # not an Exception: Ray's `except Exception` must not swallow it
    pass


class _StopSignal:
    """SIGINT/SIGTERM -> an event; while `interrupting()`, also an exception in the main thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._interrupt = False
        self.at = 0.0
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self._event.is_set():
            self.at = time.monotonic()
            self._event.set()
        if self._interrupt:
            self._interrupt = False
            raise _Interrupted

    @contextmanager
    def interrupting(self) -> Iterator[None]:
        self._interrupt = not self._event.is_set()
        if not self._interrupt:
            raise _Interrupted
        try:
            yield
        finally:
            self._interrupt = False

    def wait(self) -> None:
        self._event.wait()
