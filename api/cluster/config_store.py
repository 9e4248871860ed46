"""Serving-endpoint definitions shared by every replica of a serve-ray deployment.

Owns: `EndpointConfigActor`, a Ray actor (named, detached: it outlives any one replica) that is
the single writer of the definitions and persists them in the same SQLite file a single node
uses (api/http/databricks/store.py's file, so `switchyard serve` on that host sees the same
endpoints); `SharedEndpointStore`, the replica-side adapter with EndpointStore's interface
(load / put / delete, awaited on the replica's trio loop), which `ServingEndpoints` writes
through; and `watch_endpoints`, the replica's subscription.

Why one actor: every write from every replica is a method call on it, under one lock from check
to commit, so the file has exactly one writer, in one process (SQLite's own locking is never
relied on across hosts); writes are compare-and-set on `config_version`. A change reaches every
replica without a restart: each long-polls `watch(version)` and swaps its whole snapshot in one
assignment, so in-flight requests keep their model. The actor also carries the driver's stop to
every replica at once (`announce_stop` / `wait_stop`). docs/scaling-out.md ("Shared state")
says the same for operators. Imports ray (only inside the functions, the actor and the adapter)
and api.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import trio

from api.http.databricks.store import EndpointStore
from runtime.errors import ServingError
from runtime.logging import get_logger

log = get_logger("cluster.config")

ACTOR_NAME = "switchyard-endpoint-config"
NAMESPACE = "switchyard"
WATCH_TIMEOUT_S = 30.0
# The run-time adapters' long-poll is short: a replica that watches has called within this long
# (plus a margin), so one that died without leaving stops being waited for within seconds.
ADAPTERS_WATCH_S = 5.0


class ConfigConflict(ServingError):
    status = 409
    type = "invalid_request_error"
    code = "RESOURCE_CONFLICT"


class _File(EndpointStore):
    """EndpointStore's synchronous SQLite operations, without its trio lock (this is asyncio)."""

    def __init__(self, path: Path) -> None:
        self.path = path


class _Feed:
    """A version that moves on each change, long-polled by subscribers (`wait`, at most `poll_s`),
    and each subscriber's version as of its last poll (`applied`)."""

    def __init__(self, poll_s: float) -> None:
        self.version, self.poll_s = 1, poll_s
        self._changed = asyncio.Event()
        self._polled: dict[str, tuple[int, float]] = {}  # subscriber -> (version, when)

    def bump(self) -> int:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return self.version

    async def wait(self, subscriber: str, known: int) -> None:
        """Returns once the version differs from `known`, or `poll_s` later."""
        self._polled[subscriber] = (known, time.monotonic())
        if known == self.version:
            try:
                await asyncio.wait_for(self._changed.wait(), self.poll_s)
            except TimeoutError:
                pass

    def applied(self, max_age_s: float) -> dict[str, int]:
        now = time.monotonic()
        return {s: v for s, (v, when) in self._polled.items() if now - when < max_age_s}

    def leave(self, subscriber: str) -> None:
        self._polled.pop(subscriber, None)


class EndpointConfigActor:
    """The one writer (Ray runs an actor's calls one at a time); async so `watch` can wait."""

    def __init__(self, path: str) -> None:
        self._endpoints = _Feed(WATCH_TIMEOUT_S)
        self._open(path)
        self._lock = asyncio.Lock()  # an async actor interleaves calls at each await
        self._stopping = asyncio.Event()
        # LoRA adapters loaded at run time on some replica, name → path (in memory: they last as
        # long as the deployment, as on one process), and each replica's applied version.
        self.adapters: dict[str, str] = {}
        self._adapters = _Feed(ADAPTERS_WATCH_S)

    @property
    def version(self) -> int:
        return self._endpoints.version

    def _open(self, path: str) -> None:
        self._file = _File(Path(path))
        self.path = path
        self._stored: dict[str, str] = self._file._load_sync()

    async def reopen(self, path: str) -> None:
        """A deployment with another state directory took over this (detached) actor."""
        async with self._lock:
            if path != self.path:
                self._open(path)
                self._endpoints.bump()

    async def snapshot(self) -> tuple[int, dict[str, str]]:
        return self.version, dict(self._stored)

    async def put(self, name: str, definition: str) -> None:
        async with self._lock:
            await self._put(name, definition)

    # A `PUT .../config` reaches whichever replica the router picked. Compare-and-set: a replica
    # writes version v+1 only over v (or version 1 over nothing), so two replicas updating one
    # endpoint at once cannot both win; the loser's client gets a 409 and retries against the new
    # version. A write that would store exactly what is stored (every replica applying the config
    # file's [[endpoints]] at start) is a no-op.
    async def _put(self, name: str, definition: str) -> None:
        new = json.loads(definition)
        old = json.loads(self._stored[name]) if name in self._stored else None
        version = new.get("config_version", 1)
        if old is not None and old.get("config_version") == version and _same_config(old, new):
            return  # already stored (another replica applied the same declared endpoint)
        expected = None if old is None else old.get("config_version")
        if (expected is None and version != 1) or (expected is not None and version != expected + 1):
            raise ConfigConflict(
                f"Serving endpoint {name!r} was changed by another request (stored config_version "
                f"{expected}); nothing was changed, retry."
            )
        await asyncio.to_thread(self._file._put_sync, name, definition)
        self._stored[name] = definition
        self._endpoints.bump()

    async def delete(self, name: str) -> None:
        async with self._lock:
            await asyncio.to_thread(self._file._delete_sync, name)
            if self._stored.pop(name, None) is not None:
                self._endpoints.bump()

    # Returns as soon as the version moves (as Ray Serve's controller pushes configs to its own
    # replicas); the replica then swaps its whole snapshot in one assignment
    # (`ServingEndpoints.adopt`), so a request that already chose its model keeps it.
    async def watch(self, subscriber: str, known: int) -> tuple[int, dict[str, str]]:
        """The snapshot once its version differs from `known` (at most WATCH_TIMEOUT_S later)."""
        await self._endpoints.wait(subscriber, known)
        return self.version, dict(self._stored)

    async def applied(self, max_age_s: float = 2 * WATCH_TIMEOUT_S) -> dict[str, int]:
        """Each live subscriber's applied version (what a test or an operator checks)."""
        return self._endpoints.applied(max_age_s)

    async def set_adapter(self, name: str, path: str | None) -> int:
        """A replica loaded (`path`) or unloaded (None) an adapter: the new version."""
        if path is None:
            self.adapters.pop(name, None)
        else:
            self.adapters[name] = path
        return self._adapters.bump()

    async def watch_adapters(self, subscriber: str, known: int) -> tuple[int, dict[str, str]]:
        """As `watch`, for the adapters (at most ADAPTERS_WATCH_S later)."""
        await self._adapters.wait(subscriber, known)
        return self._adapters.version, dict(self.adapters)

    async def adapters_applied(self, max_age_s: float = ADAPTERS_WATCH_S + 2.0) -> dict[str, int]:
        return self._adapters.applied(max_age_s)

    async def leave(self, subscriber: str) -> None:
        """A replica is stopping: nothing waits for it to apply a change (one that died without
        saying so drops out of `adapters_applied` once its last watch is a few seconds old)."""
        self._endpoints.leave(subscriber)
        self._adapters.leave(subscriber)

    async def stop_serving(self) -> None:
        """The driver is stopping the deployment: every replica's `wait_stop` returns."""
        self._stopping.set()

    async def wait_stop(self) -> None:
        """Returns once the deployment is stopping (a replica then drains its live requests)."""
        await self._stopping.wait()


def _same_config(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("served", "tags", "description"))


def config_actor(path: str | Path) -> Any:
    """The deployment's config actor, created by whoever asks first (get_if_exists is atomic)."""
    import ray

    remote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(EndpointConfigActor)
    actor = remote.options(name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote(str(path))
    actor.reopen.remote(str(path))
    return actor


class SharedEndpointStore:
    """EndpointStore's interface over the config actor, for a replica's trio loop."""

    def __init__(self, actor: Any, path: str | Path) -> None:
        self.actor = actor
        self.path = Path(path)

    async def load(self) -> dict[str, str]:
        return (await _call(self.actor.snapshot))[1]

    async def put(self, name: str, definition: str) -> None:
        await _call(self.actor.put, name, definition)

    async def delete(self, name: str) -> None:
        await _call(self.actor.delete, name)


async def _call(method: Any, *args: Any) -> Any:
    import ray

    ref = method.remote(*args)
    try:
        return await trio.to_thread.run_sync(ray.get, ref, abandon_on_cancel=True)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        if isinstance(cause, ConfigConflict):
            raise ConfigConflict(str(cause.args[0]) if cause.args else "conflict") from None
        raise OSError(f"the endpoint config actor failed: {exc}") from None
    except ray.exceptions.RayActorError as exc:
        raise OSError(f"the endpoint config actor is unavailable: {exc}") from None


# Ray Serve tells a replica nothing until its live requests are done, so without this a long
# stream held the stop past --drain-timeout until Ray killed the replica mid-stream.
def announce_stop(timeout_s: float = 5.0) -> None:
    """Tell every replica of the deployment to drain now (the driver, before Serve's shutdown);
    nothing when the actor is gone or does not answer in time (the replicas then drain when
    Serve stops them)."""
    import ray

    try:
        ray.get(ray.get_actor(ACTOR_NAME, namespace=NAMESPACE).stop_serving.remote(), timeout=timeout_s)
    except (ValueError, ray.exceptions.RayError) as exc:
        log.warning("stop_announcement_failed", error=repr(exc)[:300])


def forget_config_actor() -> None:
    """End the detached actor (its state is in the SQLite file), so that a later deployment on
    the same cluster starts with a fresh one, not one that is stopping."""
    import ray

    try:
        ray.kill(ray.get_actor(ACTOR_NAME, namespace=NAMESPACE), no_restart=True)
    except (ValueError, ray.exceptions.RayError):
        pass


async def watch_endpoints(actor: Any, subscriber: str, adopt: Any, adapters: bool = False) -> None:
    """Run on the replica's asyncio loop until cancelled: `await adopt(snapshot)` on each change
    of the endpoints (or, `adapters`, of the run-time LoRA adapters)."""
    known = -1
    watch = actor.watch_adapters if adapters else actor.watch
    while True:
        try:
            version, stored = await watch.remote(subscriber, known)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the actor is restarting: try again shortly
            log.warning("endpoint_watch_failed", adapters=adapters, error=repr(exc))
            await asyncio.sleep(1.0)
            continue
        if version != known:
            await adopt(stored)
            known = version


class SharedAdapters:
    """The platform's `adapter_sync` on a replica: a run-time adapter load or unload published
    to every replica, answered once each live replica has applied it (at most `wait_s`)."""

    def __init__(self, actor: Any, wait_s: float = 3 * ADAPTERS_WATCH_S) -> None:
        self.actor, self.wait_s = actor, wait_s

    async def publish(self, name: str, path: str | None) -> None:
        version = await _call(self.actor.set_adapter, name, path)
        with trio.move_on_after(self.wait_s) as waited:
            while min((await _call(self.actor.adapters_applied)).values(), default=version) < version:
                await trio.sleep(0.05)
        if waited.cancelled_caught:
            log.warning("shared_adapter_slow", adapter=name, version=version, seconds=self.wait_s)
