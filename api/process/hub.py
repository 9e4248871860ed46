"""What the HTTP front ends of one server share (`--api-servers`), held by the parent.

Owns the control socket between the parent front end (the hub) and each other one, its
messages (msgpack frames, as the engine's), and the stand-ins a front end's platform takes for
what must hold across processes, each answered by the hub:
- per-key rate limits: `HubLimiter` (admit, awaited; settle), one call a request, answered from
  the parent's own `RateLimiter`, so two front ends never both spend a bucket's last request;
- serving endpoints: `HubStore` (load / put / delete through the parent's SQLite store); after
  any change the hub sends every front end the new definitions, which each adopts (as a
  serve-ray replica adopts its config actor's);
- `/metrics`: a front end asks the hub, which asks every other one for its exposition and
  merges them with its own (runtime/metrics_merge.py): one scrape, whichever process answers.
The parent's own app uses the same limiter and a store that tells the others of its changes.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from api.http.databricks.store import EndpointStore
from runtime.engine_wire import Frames, frame
from runtime.logging import get_logger
from runtime.metrics_merge import merge_expositions
from runtime.replies import Gone, Replies

log = get_logger("front_ends")


class Admit(msgspec.Struct, tag="admit", frozen=True):
    call: int
    who: str
    tokens: int


class Settle(msgspec.Struct, tag="settle", frozen=True):
    who: str
    charged: int
    used: int


class MetricsAsk(msgspec.Struct, tag="metrics_ask", frozen=True):
    call: int


class StoreCall(msgspec.Struct, tag="store", frozen=True):
    call: int
    op: str  # load, put, delete
    name: str = ""
    definition: str = ""


class Reply(msgspec.Struct, tag="reply", frozen=True):
    call: int
    value: Any = None
    error: str | None = None


class Endpoints(msgspec.Struct, tag="endpoints", frozen=True):
    """hub → front end: every defined serving endpoint (name → JSON), after a change."""

    stored: dict[str, str]


class Drain(msgspec.Struct, tag="drain", frozen=True):
    """hub → front end: stop admitting, drain, exit (the parent alone reads the signals)."""


Message = Admit | Settle | MetricsAsk | StoreCall | Reply | Endpoints | Drain


class Peer:
    """One end of a control socket: calls that wait for their reply, and a reader that answers
    the other end's calls with `handle` (a reply value, or None for none)."""

    def __init__(self, sock: socket.socket) -> None:
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self._replies = Replies()
        self._lock = trio.Lock()

    async def send(self, message: Message) -> None:
        async with self._lock:
            await self.stream.send_all(frame(message))

    async def call(self, make: Callable[[int], Message]) -> Any:
        try:
            reply: Reply = await self._replies.ask(lambda number: self.send(make(number)))
        except Gone:
            raise OSError("the other front end went before it answered") from None
        if reply.error is not None:
            raise OSError(reply.error)
        return reply.value

    async def serve(self, handle: Callable[[Any], Awaitable[Any]]) -> None:
        """Until the other end closes; each call is answered in its own task."""
        frames = Frames(Message)
        async with trio.open_nursery() as nursery:
            while data := await self._receive():
                for message in frames.feed(data):
                    if isinstance(message, Reply):
                        self._replies.answer(message.call, message)
                    else:
                        nursery.start_soon(self._answer, handle, message)
            self._replies.fail_all()
            nursery.cancel_scope.cancel()

    async def _receive(self) -> bytes:
        try:
            return await self.stream.receive_some(1 << 16)
        except trio.BrokenResourceError:  # the other end went without closing cleanly: as an end
            return b""

    async def _answer(self, handle: Callable[[Any], Awaitable[Any]], message: Any) -> None:
        """One call answered: its value, or the line of what it raised (a store that cannot be
        written, say), so that a failing call fails that call alone."""
        try:
            reply = Reply(getattr(message, "call", -1), value=await handle(message))
        except Exception as exc:  # noqa: BLE001 - sent back to the caller, whose request fails cleanly
            log.error("front_end_call_failed", message=type(message).__name__, error=repr(exc)[:300])
            reply = Reply(getattr(message, "call", -1), error=f"{type(exc).__name__}: {exc}")
        if hasattr(message, "call"):
            try:
                await self.send(reply)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the caller went


class Hub:
    """The parent's side: its front ends' peers, the shared limiter and store, the merged view."""

    def __init__(self, limiter: Any, store: EndpointStore, exposition: Callable[[], bytes]) -> None:
        self.limiter, self.store, self.exposition = limiter, store, exposition
        self.peers: list[Peer] = []
        self.adopt: Callable[[dict[str, str]], None] | None = None  # the parent's own endpoints

    async def handle(self, message: Any) -> Any:
        if isinstance(message, Admit):
            return list(self.limiter.admit(message.who, message.tokens))
        if isinstance(message, Settle):
            self.limiter.settle(message.who, message.charged, message.used)
            return None
        if isinstance(message, MetricsAsk):
            return await self.merged()
        if isinstance(message, StoreCall):
            if message.op == "load":
                return await self.store.load()
            await (self.store.put(message.name, message.definition) if message.op == "put" else self.store.delete(message.name))
            await self.changed()
            return None
        raise ValueError(f"unexpected {type(message).__name__}")

    async def merged(self) -> bytes:
        texts = [self.exposition()]
        for peer in list(self.peers):
            with trio.move_on_after(2.0):  # a front end stopping is left out of this scrape
                try:
                    texts.append(await peer.call(MetricsAsk))
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        return merge_expositions(texts)

    async def changed(self) -> None:
        """Every front end, this one too, takes the store's definitions."""
        stored = await self.store.load()
        if self.adopt is not None:
            self.adopt(stored)
        for peer in list(self.peers):
            try:
                await peer.send(Endpoints(stored))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


class TellingStore:
    """The parent's endpoint store: its own writes are told to the other front ends."""

    def __init__(self, store: EndpointStore, hub: Hub) -> None:
        self.store, self.hub, self.path = store, hub, store.path

    async def load(self) -> dict[str, str]:
        return await self.store.load()

    async def put(self, name: str, definition: str) -> None:
        await self.store.put(name, definition)
        await self.hub.changed()

    async def delete(self, name: str) -> None:
        await self.store.delete(name)
        await self.hub.changed()


class HubLimiter:
    """`RateLimiter`'s interface for a front end other than the parent (admit is awaited)."""

    def __init__(self, peer: Peer, config: Any) -> None:
        self.peer, self.config = peer, config

    @property
    def enabled(self) -> bool:
        return self.config.requests_per_minute is not None or self.config.tokens_per_minute is not None

    async def admit(self, who: str, tokens: int) -> tuple[float, str]:
        wait, which = await self.peer.call(lambda call: Admit(call, who, tokens))
        return float(wait), str(which)

    def settle(self, who: str, charged: int, used: int) -> None:
        if charged != used:
            trio.lowlevel.spawn_system_task(self._settle, Settle(who, charged, used))

    async def _settle(self, message: Settle) -> None:
        try:
            await self.peer.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the parent is gone: this front end is about to go too


class HubStore:
    """`EndpointStore`'s interface for a front end other than the parent: the hub's file."""

    def __init__(self, peer: Peer, path: Any) -> None:
        self.peer, self.path = peer, path

    async def load(self) -> dict[str, str]:
        return dict(await self.peer.call(lambda call: StoreCall(call, "load")))

    async def put(self, name: str, definition: str) -> None:
        await self.peer.call(lambda call: StoreCall(call, "put", name, definition))

    async def delete(self, name: str) -> None:
        await self.peer.call(lambda call: StoreCall(call, "delete", name))
