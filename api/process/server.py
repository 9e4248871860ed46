"""`serve_runtime`: one machine's engines and the HTTP app on Hypercorn, in one trio nursery.

Owns: the listening sockets (bound before any model loads, so a taken port fails at once),
Hypercorn's settings, and the shutdown order on SIGINT/SIGTERM: stop admitting, drain
in-flight requests up to the deadline, abort the rest, then stop the actors.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from actors.build import build_engine
from api.http.app import build_app
from api.http.platform import config as platform_config
from runtime.config import RuntimeConfig
from runtime.logging import get_logger
from runtime.memory import freeze_startup_heap
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry

log = get_logger("serve")


async def serve_runtime(
    config: RuntimeConfig,
    runtime_factory: Callable[[RuntimeConfig], Runtime] | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    extra_models: Sequence[RuntimeConfig] = (),
    platform: platform_config.PlatformConfig | None = None,
    sockets: Sockets | None = None,
    freeze_heap: bool = False,
    companions: Companions | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the runtime and the HTTP server until `shutdown_trigger` returns, then drain.
    `sockets`: the listening sockets (`listen(config)`); None: bound here, before any model
    is loaded, so a taken port fails at once. `freeze_heap`: once the models are up, keep what
    is alive out of later garbage collections (runtime/memory.py; the process's own serve, not
    a test's in-process server, whose frozen objects would outlive it). `companions`: the other
    front ends (`--api-servers`, api/process/front_ends.py), started before the models load and
    given their engines once this one serves, drained with it and waited for before the
    engines stop."""
    hconfig, companions = _hypercorn_config(config), companions or _Alone()
    sockets = sockets if sockets is not None else listen(config, hconfig)
    models, app = build_app([config, *extra_models], runtime_factory or build_engine, platform)

    async with trio.open_nursery() as nursery:
        # Listen for signals from the start, so a SIGTERM during model loading is queued (and
        # acted on once up) rather than killing the process mid-conversion.
        shutdown, force = trio.Event(), trio.Event()
        watcher: trio.CancelScope = await nursery.start(_watch_for_shutdown, shutdown_trigger, shutdown, force)
        await companions.prepare(nursery)
        await nursery.start(models.run)
        if freeze_heap:
            freeze_startup_heap()
        stop_http = trio.Event()
        async with trio.open_nursery() as http:
            binds = await http.start(partial(worker_serve, wrap_app(app, hconfig.wsgi_max_body_size, "asgi"), hconfig, sockets=sockets, shutdown_trigger=stop_http.wait))
            log.info("listening", binds=binds)
            await companions.start(nursery, models, app, shutdown)
            task_status.started(binds)
            await shutdown.wait()
            await companions.drain()
            # 1. stop admitting (new requests get 503), 2. let in-flight ones finish until the
            # drain deadline (a second signal cuts it short), 3. abort the rest: each gets a
            # clean error (an SSE error event, or a 503 body).
            log.info("shutting_down", live_requests=_live(models), drain_timeout=config.drain_timeout)
            aborted = 0
            with trio.CancelScope() as drain_scope:
                http.start_soon(_cancel_when, force, drain_scope)
                aborted = await models.drain(config.drain_timeout)  # aborts those past the deadline
            aborted += await models.drain(0)  # and those a second signal left (none otherwise)
            log.info("drained", aborted=aborted)
            # 4. hypercorn closes its listeners and idle connections, and waits (up to its
            # graceful_timeout) for open responses, the aborted ones' error events included.
            stop_http.set()
            force.set()  # ends the _cancel_when helper
        # 5. only now stop the actors: nothing can reach them any more (nor, from the other
        # front ends, once they have drained and exited).
        await companions.wait(config.drain_timeout + 10)
        models.stop()
        watcher.cancel()
        log.info("stopped")


def _hypercorn_config(config: RuntimeConfig) -> HypercornConfig:
    hconfig = HypercornConfig()
    hconfig.bind = [f"{config.host}:{config.port}"]
    hconfig.accesslog = None
    # Our own drain (serve_runtime) waits for in-flight requests before hypercorn is told to
    # stop, so its graceful period only has to flush the last bytes; a long one made every idle
    # keep-alive connection hold shutdown up for the whole period.
    hconfig.graceful_timeout = 2.0
    hconfig.keep_alive_timeout = 75
    return hconfig


def listen(config: RuntimeConfig, hconfig: HypercornConfig | None = None) -> Sockets:
    """The listening sockets for --host and --port; `BindError` naming the flag when the
    address cannot be had (in use, or not this machine's)."""
    hconfig = hconfig or _hypercorn_config(config)
    try:
        sockets = hconfig.create_sockets()
    except OSError as exc:
        reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be listened on: {exc.strerror or exc}"
        flag = "--port" if exc.errno == errno.EADDRINUSE else "--host"
        raise BindError(f"{flag}: {config.host}:{config.port} {reason}") from None
    for sock in sockets.insecure_sockets:
        sock.listen(hconfig.backlog)
    return sockets


class BindError(Exception):
    pass


class Companions(Protocol):
    async def prepare(self, nursery: trio.Nursery) -> None: ...
    async def start(self, nursery: trio.Nursery, models: ModelRegistry, app: Any, shutdown: trio.Event) -> None: ...
    async def drain(self) -> None: ...
    async def wait(self, timeout: float) -> None: ...


class _Alone:
    """One front end: no one else to start, drain or wait for."""

    async def prepare(self, nursery: trio.Nursery) -> None:
        pass

    async def start(self, nursery: trio.Nursery, models: ModelRegistry, app: Any, shutdown: trio.Event) -> None:
        pass

    async def drain(self) -> None:
        pass

    async def wait(self, timeout: float) -> None:
        pass


def _live(models: ModelRegistry) -> int:
    return sum(len(runtime.requests) for runtime in models)


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _watch_for_shutdown(
    trigger: Callable[[], Awaitable[None]] | None,
    shutdown: trio.Event,
    force: trio.Event,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """First SIGINT/SIGTERM (or `trigger` returning): drain. A second one: stop waiting."""
    with trio.CancelScope() as scope:
        if trigger is not None:
            task_status.started(scope)
            await trigger()
            shutdown.set()
            return
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started(scope)
            async for signum in signals:
                if shutdown.is_set():
                    log.warning("forced_shutdown", signal=signal.Signals(signum).name)
                    force.set()
                    return
                log.info("signal_received", signal=signal.Signals(signum).name)
                shutdown.set()
