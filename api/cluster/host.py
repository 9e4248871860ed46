"""`TrioHost`: one node's whole stack (runtimes + the Quart app) on a trio thread, driven from
asyncio. What a serve-ray replica runs.

Owns the bridge between Ray Serve's asyncio loop and Switchyard's trio loop:

- the trio thread builds the registry and app with `api.http.app.build_app` (the same code as
  `switchyard serve`: one HTTP stack, every route and error shape written once), runs the
  runtimes, and drives the app's ASGI lifespan (before_serving: endpoints loaded, watchdog);
- `stream(request)` (asyncio) runs one raw ASGI request through the app on the trio loop
  and yields its ASGI send messages as they are sent: each SSE chunk crosses as soon as the
  app sends it, never held back to be batched;
- leaving `stream` early (the caller's task cancelled: the client disconnected, or the
  ingress gave up) delivers `http.disconnect` to the app and cancels the request's trio scope,
  so the route's `finally` aborts the engine request and its KV blocks are freed at the
  scheduler's next step, as when a client leaves a single node;
- `call(fn)` runs a synchronous function on the trio thread and awaits its result from
  asyncio (statistics, health: trio's objects are only touched by their own thread).

Messages cross by `TrioToken.run_sync_soon` one way and `loop.call_soon_threadsafe` the
other: neither side ever blocks on the other. Imports trio, asyncio and api.http.app.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from actors.build import build_engine
from api.http.app import build_app
from runtime.logging import get_logger
from runtime.memory import freeze_startup_heap

log = get_logger("cluster.host")

_END = object()
PORTABLE_SCOPE_KEYS = ("type", "http_version", "method", "scheme", "path", "raw_path", "query_string", "root_path", "headers", "client", "server")


@dataclass
class HttpRequest:
    """One HTTP request as it crosses from the ingress to a replica (picklable)."""

    scope: dict[str, Any]
    body: bytes


def portable_scope(scope: dict[str, Any]) -> dict[str, Any]:
    out = {k: scope[k] for k in PORTABLE_SCOPE_KEYS if k in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", ())]
    out["client"] = tuple(scope["client"]) if scope.get("client") else None
    out["server"] = tuple(scope["server"]) if scope.get("server") else None
    return out


class HostDead(RuntimeError):
    pass


@dataclass(eq=False)  # identity: kept in a set
class _Exchange:
    """One request's state shared by both threads; fields are only written on the trio thread,
    except `put`, which is thread-safe."""

    put: Callable[[Any], None]
    scope: trio.CancelScope | None = None
    disconnected: trio.Event = field(default_factory=trio.Event)
    cancelled: bool = False
    done: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        self.disconnected.set()
        if self.scope is not None:
            self.scope.cancel()


class TrioHost:
    def __init__(self, configs: Sequence[Any], platform: Any = None, runtime_factory: Callable[[Any], Any] | None = None, freeze_heap: bool = False) -> None:
        self._configs = list(configs)
        self._freeze_heap = freeze_heap  # a replica's own process: runtime/memory.py freeze_startup_heap
        self._platform = platform
        self._factory = runtime_factory or build_engine
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self.models: Any = None
        self.app: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._drain_timeout = 5.0
        self._live: set[_Exchange] = set()  # requests whose stream has not ended
        self._thread = threading.Thread(target=self._thread_main, name="switchyard-trio", daemon=True)
        self._thread.start()

    # -- life cycle (trio thread) -------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported through health and wait_ready
            self.error = exc
            log.error("trio_host_failed", error=repr(exc))
        finally:
            self._ready.set()
            for exchange in list(self._live):  # their trio tasks are gone: end their streams
                exchange.put(HostDead(f"the runtime's thread ended ({self.error!r})"))

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self.models, self.app = build_app(self._configs, self._factory, self._platform)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.models.run)
            lifespan = _Lifespan(self.app)
            await nursery.start(lifespan.run)
            if self._freeze_heap:
                freeze_startup_heap()
            self._ready.set()
            await self._stop.wait()
            await self.models.drain(self._drain_timeout)
            await lifespan.shutdown()
            self.models.stop()

    async def wait_ready(self) -> None:
        await asyncio.to_thread(self._ready.wait)
        if self.error is not None or self._token is None:
            raise HostDead(f"the runtime failed to start: {self.error!r}") from self.error

    def stop(self, drain_timeout: float = 5.0, join_timeout: float = 30.0) -> None:
        """Drain (live requests get `drain_timeout` s), then stop the actors; blocks until done."""
        self._drain_timeout = drain_timeout
        if self._token is not None and self._thread.is_alive():
            try:
                self._token.run_sync_soon(self._stop.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(join_timeout)

    async def drain(self, timeout: float) -> None:
        """Stop admitting (new requests get 503), give live requests `timeout` s, then abort
        the rest, each with a clean error, as `switchyard serve` does on SIGTERM; the
        runtimes keep running until `stop`."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        async def drain_then_settle() -> None:
            try:
                await self.models.drain(timeout)
            finally:
                loop.call_soon_threadsafe(_settle, done, None, None)

        def start() -> None:  # on the trio thread; never raises (it would end the trio run)
            try:
                self._nursery.start_soon(drain_then_settle)
            except RuntimeError:  # the nursery is closed: already stopping, nothing to drain
                loop.call_soon_threadsafe(_settle, done, None, None)

        self._submit(start)
        await done

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # -- calls from asyncio ---------------------------------------------------------------------

    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._token is None or not self._thread.is_alive():
            raise HostDead(f"the runtime's thread has ended ({self.error!r})")
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            raise HostDead("the runtime's thread has ended") from None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a synchronous `fn(*args)` on the trio thread; its result (or exception) here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def run() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        self._submit(run)
        return await future

    async def call_async(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Await `fn(*args)` as a task of the trio loop's nursery; its result (or exception) here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        async def run() -> None:
            try:
                result = await fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                loop.call_soon_threadsafe(_settle, future, None, exc)
                if not isinstance(exc, Exception):
                    raise  # trio's cancellation goes on
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        def start() -> None:  # on the trio thread; never raises
            try:
                self._nursery.start_soon(run)
            except RuntimeError as exc:  # the nursery is closed: shutting down
                loop.call_soon_threadsafe(_settle, future, None, HostDead(f"the runtime is shutting down ({exc})"))

        self._submit(start)
        return await future

    async def stream(self, request: HttpRequest) -> AsyncIterator[list[dict[str, Any]]]:
        """The app's ASGI send messages for `request`, as they are sent: each time, every
        message already waiting (one Ray object per batch instead of per message, without
        ever waiting to fill one: a lone token still crosses alone, at once)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        exchange = _Exchange(put=put)
        self._submit(self._start, request, exchange)
        self._live.add(exchange)
        try:
            ended = False
            while not ended:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                if ended := batch[-1] is _END:
                    batch.pop()
                failure = next((item for item in batch if isinstance(item, BaseException)), None)
                if failure is not None:
                    raise failure
                if batch:
                    yield batch
        finally:
            self._live.discard(exchange)
            if not exchange.done:
                try:
                    self._submit(exchange.cancel)
                except HostDead:
                    pass

    def _start(self, request: HttpRequest, exchange: _Exchange) -> None:
        """On the trio thread. Never raises: an exception here would end the whole trio run."""
        try:
            self._nursery.start_soon(self._serve, request, exchange)
        except RuntimeError as exc:  # the nursery is closed: shutting down
            exchange.done = True
            exchange.put(HostDead(f"the runtime is shutting down ({exc})"))

    async def _serve(self, request: HttpRequest, exchange: _Exchange) -> None:
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await exchange.disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            exchange.put(message)

        try:
            with trio.CancelScope() as exchange.scope:
                if exchange.cancelled:
                    exchange.scope.cancel()
                await self.app({**request.scope, "state": {}, "extensions": {}}, receive, send)
        except Exception as exc:  # the app turns every error into a response; this is a bug
            log.exception("asgi_request_failed", path=request.scope.get("path"), error=repr(exc))
        finally:
            exchange.done = True
            exchange.put(_END)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class _Lifespan:
    """Drives the app's ASGI lifespan as Hypercorn would: startup before serving, shutdown at the end."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._to_app, self._from_host = trio.open_memory_channel[dict[str, Any]](2)
        self._started = trio.Event()
        self._finished = trio.Event()
        self._failure: str | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async def send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind.startswith("lifespan.startup"):
                self._failure = message.get("message", "startup failed") if kind.endswith("failed") else None
                self._started.set()
            elif kind.startswith("lifespan.shutdown"):
                self._finished.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.app, {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}, self._from_host.receive, send)
            await self._to_app.send({"type": "lifespan.startup"})
            await self._started.wait()
            if self._failure is not None:
                raise RuntimeError(f"the app failed to start: {self._failure}")
            task_status.started()

    async def shutdown(self) -> None:
        await self._to_app.send({"type": "lifespan.shutdown"})
        with trio.move_on_after(10):
            await self._finished.wait()
