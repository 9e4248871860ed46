"""`SwitchyardReplica`: the Ray Serve deployment class whose replicas serve the models.

Owns one replica's life: it hosts a whole single-node stack (api/cluster/host.py: the trio
runtime, the actors, the executor thread and the paged cache, and the Quart app) and
serves that app's ASGI messages, streamed, on either topology (api/cluster/deploy.py): to
the ingress's `handle_http` calls (relay), or, when deploy.py wraps this class with
`serve.ingress()`, straight to Ray's HTTP proxy through `__serve_build_asgi_app__` (direct).
Either way the client leaving cancels the call, which aborts the request on the trio loop and
frees its blocks. It also:

- reports its load to the routers (`record_routing_stats`: live, running and waiting requests,
  KV usage as a 0-1 fraction), which Ray Serve polls every `routing_stats_period_s`;
- fails Ray's `check_health` when a runtime died, the device thread is gone, a step has run
  past `step_deadline`, or the trio loop stopped answering, so the controller replaces it;
- follows the shared endpoint config and the LoRA adapters loaded at run time on any replica
  (api/cluster/config_store.py) for its whole life, and counts per-key rate limits in the
  deployment's shared buckets (api/cluster/limits.py);
- drains its live requests (up to `drain_timeout`) as soon as the driver announces the stop.

Each response carries `x-switchyard-replica`, the replica's id. Imports ray and api.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from api.cluster.config_store import SharedAdapters, SharedEndpointStore, config_actor, watch_endpoints
from api.cluster.edge import lifespan, read_body, relay
from api.cluster.host import HttpRequest, TrioHost, portable_scope
from api.cluster.limits import SharedRateLimiter, rate_limit_actor
from api.cluster.settings import ClusterSpec
from runtime.logging import configure_logging, get_logger

log = get_logger("cluster.replica")

REPLICA_HEADER = b"x-switchyard-replica"
HEALTH_CALL_TIMEOUT_S = 10.0


class SwitchyardReplica:
    async def __init__(self, spec: ClusterSpec) -> None:  # type: ignore[misc]  # Ray Serve awaits an async constructor
        from ray import serve

        configure_logging(spec.log_level)  # a Ray worker process: structlog's defaults until now
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.spec = spec
        path = spec.platform.endpoints_db
        self._config = config_actor(path)
        limiter = None
        if spec.platform.requests_per_minute or spec.platform.tokens_per_minute:
            limiter = SharedRateLimiter(rate_limit_actor(spec.platform), spec.platform)
        shared = {"endpoint_store": SharedEndpointStore(self._config, path), "adapter_sync": SharedAdapters(self._config)}
        platform = dataclasses.replace(spec.platform, rate_limiter=limiter, **shared)
        self.host = TrioHost(spec.models, platform, freeze_heap=True)  # the replica's own process
        await self.host.wait_ready()
        loop = asyncio.get_running_loop()
        self._watcher = loop.create_task(watch_endpoints(self._config, self.replica_id, self._adopt))
        self._adapters = loop.create_task(watch_endpoints(self._config, self.replica_id, self._adopt_adapters, adapters=True))
        self._stop_watcher = loop.create_task(self._drain_when_stopping())
        log.info("replica_ready", replica=self.replica_id, models=[c.served_name for c in spec.models])

    async def _adopt(self, stored: dict[str, str]) -> None:
        endpoints = self.host.app.extensions["serving_endpoints"]
        await self.host.call(endpoints.adopt, stored)

    async def _adopt_adapters(self, shared: dict[str, str]) -> None:
        """LoRA adapters loaded or unloaded at run time on any replica (api/http/openai/lora.py)."""
        await self.host.call_async(self.host.app.extensions["lora_adapters"].adopt, shared)

    async def _drain_when_stopping(self) -> None:
        """Drain as soon as the driver stops the deployment (config_store.announce_stop): Ray
        Serve only calls __del__ once no request is left, so a stream would otherwise run on
        until Ray's graceful_shutdown_timeout_s and be cut by a kill."""
        while True:
            try:
                await self._config.wait_stop.remote()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the actor is restarting: wait again
                log.warning("stop_watch_failed", error=repr(exc)[:300])
                await asyncio.sleep(1.0)
        log.info("replica_draining", replica=self.replica_id, drain_timeout=self.spec.drain_timeout)
        await self.host.drain(self.spec.drain_timeout)

    async def handle_http(self, request: HttpRequest, routing: Any = None) -> AsyncIterator[list[dict[str, Any]]]:
        """The app's ASGI messages for one request, in batches of those already sent (host.py);
        `routing` is the router's, unused here."""
        async for batch in self.host.stream(request):
            if batch[0]["type"] == "http.response.start":
                start = batch[0]
                batch[0] = {**start, "headers": [*start.get("headers", ()), (REPLICA_HEADER, self.replica_id.encode())]}
            yield batch

    def __serve_build_asgi_app__(self) -> Any:
        """The direct topology's HTTP entry (Ray calls it once `serve.ingress()` wraps the class)."""

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # a plain function:
            await self.asgi(scope, receive, send)  # uvicorn takes a bound method for ASGI2

        return app

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """One request from Ray's proxy through this replica's app; a failure of the runtime's
        thread gets the edge's clean error (api/cluster/edge.py), as on the relay."""
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: no route takes them
        request = HttpRequest(portable_scope(scope), await read_body(receive))
        # Leaving handle_http early (this task cancelled) cancels the request on the trio loop.
        await relay(self.handle_http(request), scope, send)

    async def record_routing_stats(self) -> dict[str, Any]:
        return await self.host.call(self._load)

    def _load(self) -> dict[str, Any]:
        live = running = waiting = used = total = 0
        for runtime in self.host.models:
            if getattr(runtime, "scheduler", None) is None:
                continue
            stats = runtime.statistics()
            live += stats.get("live_requests", 0)
            running += stats.get("running", 0)
            waiting += stats.get("waiting", 0)
            used += stats.get("kv_blocks_used", 0)
            total += stats.get("kv_blocks_used", 0) + stats.get("kv_blocks_free", 0)
        return {"live": live, "running": running, "waiting": waiting, "kv_usage": used / total if total else 0.0}

    async def check_health(self) -> None:
        if not self.host.alive:
            raise RuntimeError(f"the runtime's thread has ended: {self.host.error!r}")
        try:
            ok, reason = await asyncio.wait_for(self.host.call(self.host.models.health), HEALTH_CALL_TIMEOUT_S)
        except TimeoutError:
            raise RuntimeError(f"the runtime's event loop has not answered for {HEALTH_CALL_TIMEOUT_S}s") from None
        if not ok:
            raise RuntimeError(f"unhealthy: {reason}")

    async def statistics(self) -> dict[str, Any]:
        """This replica's id and each model's runtime statistics (ops and tests)."""
        stats = await self.host.call(lambda: {r.served_name: dict(r.statistics()) for r in self.host.models})
        return {"replica": self.replica_id, "models": stats}

    async def __del__(self) -> None:
        for name in ("_watcher", "_adapters", "_stop_watcher"):
            task = getattr(self, name, None)
            if task is not None:
                task.cancel()
        try:  # a run-time adapter load waits for the replicas that watch: not for this one any more
            await asyncio.wait_for(self._config.leave.remote(self.replica_id), 2.0)
        except Exception as exc:  # the actor is gone or slow: it forgets this replica in time anyway
            log.warning("config_leave_failed", replica=getattr(self, "replica_id", "?"), error=repr(exc)[:200])
        host = getattr(self, "host", None)
        if host is not None:
            await asyncio.to_thread(host.stop, self.spec.drain_timeout)
