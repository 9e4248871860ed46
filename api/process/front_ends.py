"""`--api-servers N`: N HTTP front ends on one port, each a process, sharing each model's engine process.

Owns their life. The parent is front end 0: it listens, starts the N-1 others (`python -m
api.process.worker`) with the listening sockets (the kernel gives each connection to one of
them), a control socket to the parent's hub (api/process/hub.py: rate limits, serving
endpoints, /metrics) and the command line, which each reads as the parent did while the
parent loads the models and starts each model's engine process (one socket more per other
front end: actors/engine_link.py); once it serves, it hands each its engine sockets. A front end tokenizes, streams and
detokenizes its own requests; the engine sends each its own outputs.

Signals go to the parent alone (the others ignore SIGINT and SIGTERM): it tells the others
to drain (`Drain`), drains its own requests, waits for them to exit, then stops the engines.
An engine process that dies is not started again here (the others hold its sockets): the
server drains and exits 1. A front end whose parent is gone exits at once; one that exits
early is logged, and the others serve on.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from functools import partial
from typing import Any

import msgspec
import trio
from hypercorn.config import Sockets

from api.http.databricks.store import EndpointStore
from api.http.shared.auth import RateLimiter
from api.process.hub import Drain, Hub, Peer, TellingStore
from runtime.engine_wire import attach_key
from runtime.logging import get_logger
from runtime.registry import ModelRegistry

log = get_logger("front_ends")

# What the parent hands each other front end at its start: the listening sockets' fds, the
# hub's fd, the command line (JSON) and the front end's number (its engine sockets come later,
# over the hub's socket).
LISTEN_ENV, HUB_ENV, ARGV_ENV, INDEX_ENV = "SWITCHYARD_LISTEN_FDS", "SWITCHYARD_HUB_FD", "SWITCHYARD_ARGV", "SWITCHYARD_FRONT_END"


class Parent:
    """The parent's side: the hub, the other front ends' processes, the exit status."""

    def __init__(self, platform: Any, sockets: Sockets, count: int, argv: list[str]) -> None:
        self.sockets, self.count, self.argv = sockets, count, argv
        self.hub = Hub(RateLimiter(platform), EndpointStore(platform.endpoints_db), lambda: b"")
        self.platform = dataclasses.replace(platform, rate_limiter=self.hub.limiter, endpoint_store=TellingStore(self.hub.store, self.hub), metrics_view=self.hub.merged)
        self.processes: list[trio.Process] = []
        self._hubs: list[socket.socket] = []  # the parent's end of each one's control socket
        self.failed: str | None = None  # an engine process died: exit 1

    async def prepare(self, nursery: trio.Nursery) -> None:
        """Start the others now, so their imports and checks overlap the models' loading; each
        waits for its engine sockets (`start`) before it builds its app."""
        for index in range(1, self.count):
            ours, theirs = socket.socketpair()
            listening = [s.fileno() for s in self.sockets.insecure_sockets]
            env = {**os.environ, HUB_ENV: str(theirs.fileno()), ARGV_ENV: msgspec.json.encode(self.argv).decode(), LISTEN_ENV: ",".join(map(str, listening)), INDEX_ENV: str(index)}
            command = [sys.executable, "-m", "api.process.worker"]
            self.processes.append(await nursery.start(partial(trio.run_process, command, env=env, pass_fds=[theirs.fileno(), *listening], check=False, deliver_cancel=_kill)))
            theirs.close()
            self._hubs.append(ours)

    async def start(self, nursery: trio.Nursery, models: ModelRegistry, app: Any, shutdown: trio.Event) -> None:
        """Once this front end serves: each other one gets its end of each engine's sockets (over
        its control socket, SCM_RIGHTS), then the hub answers it."""
        self.hub.exposition = app.extensions["metrics"].exposition
        self.hub.adopt = app.extensions["serving_endpoints"].adopt
        links = [link for runtime in models if (link := getattr(runtime, "link", None)) is not None]
        keys = msgspec.json.encode([attach_key(link.config) for link in links])
        for index, (ours, process) in enumerate(zip(self._hubs, self.processes, strict=True), 1):
            try:
                socket.send_fds(ours, [keys], [link.spare[index - 1].fileno() for link in links])
            except OSError:  # it went while the models loaded (its log says why)
                log.error("front_end_exited", pid=process.pid, returncode=process.returncode)
                continue
            finally:
                for link in links:
                    link.spare[index - 1].close()
            peer = Peer(ours)
            self.hub.peers.append(peer)
            nursery.start_soon(self._serve, peer, process, shutdown)
        nursery.start_soon(self._watch_engines, models, shutdown)
        log.info("front_ends_started", count=self.count, pids=[p.pid for p in self.processes])

    async def _serve(self, peer: Peer, process: trio.Process, shutdown: trio.Event) -> None:
        """The hub for one front end, until it goes; one that goes before the drain is logged
        (the others serve on: the kernel gives its share of connections to them)."""
        await peer.serve(self.hub.handle)
        self.hub.peers.remove(peer)
        if not shutdown.is_set():
            log.error("front_end_exited", pid=process.pid, returncode=await process.wait())

    async def _watch_engines(self, models: ModelRegistry, shutdown: trio.Event) -> None:
        while not shutdown.is_set():
            await trio.sleep(0.2)
            dead = [(runtime.served_name, reason) for runtime in models if getattr(runtime, "link", None) is not None and (reason := getattr(runtime, "dead_reason", None))]
            if dead:
                self.failed = f"{dead[0][0]}: {dead[0][1]}"
                log.error("engine_process_lost", model=dead[0][0], error=dead[0][1], front_ends=self.count)
                shutdown.set()

    async def drain(self) -> None:
        for peer in self.hub.peers:
            try:
                await peer.send(Drain())
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def wait(self, timeout: float) -> None:
        """Until every other front end has exited; those left after `timeout` are killed."""
        with trio.move_on_after(timeout):
            for process in self.processes:
                await process.wait()
            return
        for process in self.processes:
            if process.returncode is None:
                log.warning("front_end_killed", pid=process.pid)
                process.kill()
                await process.wait()


async def _kill(process: trio.Process) -> None:
    """A start that failed: the others (which ignore SIGTERM) go at once."""
    process.kill()
