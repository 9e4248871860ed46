"""Another HTTP front end (`--api-servers`, api/process/front_ends.py): its entry point and its side of the hub.

Run as `python -m api.process.worker` by the parent, which hands it the listening sockets, a
control socket to the hub and the command line, and later (over that socket) its end of each
model's engine sockets. It reads the command line and builds its app as the parent did while
the parent loads, serves it with the platform's shared pieces answered by the hub
(api/process/hub.py), answers the hub (its metrics, endpoint changes, the drain), and ignores
SIGINT and SIGTERM: the parent tells it when to drain.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
from functools import partial
from typing import Any

import msgspec
import trio
from hypercorn.config import Sockets

from api.process.front_ends import ARGV_ENV, HUB_ENV, INDEX_ENV, LISTEN_ENV
from api.process.hub import Drain, Endpoints, HubLimiter, HubStore, MetricsAsk, Peer
from api.process.main import load, usage_error
from api.process.server import serve_runtime
from runtime.engine_wire import ATTACH_ENV
from runtime.logging import get_logger
from runtime.registry import ModelRegistry

log = get_logger("front_ends")


class Child:
    """Another front end's side: answers the hub (its exposition, endpoint changes, the drain)."""

    def __init__(self, peer: Peer, hub: socket.socket) -> None:
        self.peer, self._raw = peer, hub
        self._attached = trio.Event()
        self.drained = trio.Event()
        self.app: Any = None
        self._hub = trio.CancelScope()
        self._stored: dict[str, str] | None = None  # endpoints told before the app served

    async def run(self, serve: Any) -> None:
        """The hub's calls are answered from the start: the app's start-up asks it for the endpoints."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve_hub)
            await serve()
            self._hub.cancel()

    async def prepare(self, nursery: trio.Nursery) -> None:
        """The engines' sockets, once the parent serves (its app is built meanwhile). Linux ends a
        read at the message that carries descriptors, so the hub's frames that follow are not
        read with it; the hub's reader starts after it."""
        await trio.lowlevel.wait_readable(self._raw)
        keys, fds, _, _ = socket.recv_fds(self._raw, 1 << 16, 64)
        if not keys:
            os._exit(1)  # the parent went before it served
        os.environ[ATTACH_ENV] = msgspec.json.encode(dict(zip(msgspec.json.decode(keys, type=list[str]), fds, strict=True))).decode()  # actors/engine_link.py
        self._attached.set()

    async def start(self, nursery: trio.Nursery, models: ModelRegistry, app: Any, shutdown: trio.Event) -> None:
        self.app = app
        if self._stored is not None:
            app.extensions["serving_endpoints"].adopt(self._stored)

    async def _serve_hub(self) -> None:
        with self._hub:
            await self._attached.wait()
            await self.peer.serve(self._handle)
            log.error("front_end_orphaned")  # the parent is gone: so are the engines
            os._exit(1)

    async def _handle(self, message: Any) -> Any:
        if isinstance(message, MetricsAsk):
            return self.app.extensions["metrics"].exposition() if self.app is not None else b""
        if isinstance(message, Endpoints):
            self._stored = message.stored
            if self.app is not None:
                self.app.extensions["serving_endpoints"].adopt(message.stored)
        elif isinstance(message, Drain):
            self.drained.set()
        return None

    async def drain(self) -> None:
        pass

    async def wait(self, timeout: float) -> None:
        self._hub.cancel()  # drained: the parent waits for this process to exit


def main() -> None:
    """Another front end: the parent's command line, its sockets, the shared platform."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    launch = load(msgspec.json.decode(os.environ[ARGV_ENV], type=list[str]))
    listening = [socket.socket(fileno=int(fd)) for fd in os.environ[LISTEN_ENV].split(",")]
    hub = socket.socket(fileno=int(os.environ[HUB_ENV]))
    peer = Peer(hub)
    child = Child(peer, hub)
    platform = dataclasses.replace(
        launch.platform, endpoints=(), rate_limiter=HubLimiter(peer, launch.platform), endpoint_store=HubStore(peer, launch.platform.endpoints_db),
        metrics_view=lambda: peer.call(MetricsAsk),
    )  # fmt: skip
    sockets = Sockets(secure_sockets=[], insecure_sockets=listening, quic_sockets=[])
    try:
        trio.run(child.run, partial(serve_runtime, launch.configs[0], extra_models=launch.configs[1:], platform=platform, sockets=sockets, freeze_heap=True,
                                    shutdown_trigger=child.drained.wait, companions=child))  # fmt: skip
    except BaseException as exc:  # noqa: BLE001 - one line, as the parent's start-up errors
        if isinstance(exc, SystemExit):
            raise
        usage_error(f"switchyard front end {os.environ.get(INDEX_ENV)}: {type(exc).__name__}: {exc}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
