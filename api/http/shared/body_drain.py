"""Early answers on keep-alive connections: `BodyDrain`, the outermost ASGI wrapper.

Owns the rule for a response that starts before the request body was read (a 401, a shed
429, an Azure 400, a 404 for an unknown route, a 413): the body's remaining bytes are read
and dropped before the response goes out, so the connection is left between requests and
the next one on it is served; when the body is larger than the server would ever read
(`limit`) or does not arrive within `timeout`, the response goes out with
`Connection: close` instead, and the connection is closed after it.

Why this is needed (hypercorn 0.18, h11): hypercorn hands body chunks to the app through a
queue of `max_app_queue_size` (10) messages. An app that answers without reading the body
leaves that queue full; when the response ends, hypercorn puts `http.disconnect` into the
same queue and waits for room that never comes, so it neither recycles the connection
(h11's client side is still SEND_BODY) nor closes it: the client that sends its next request
on it waits forever. Reading the body to its end brings h11 to DONE first, so hypercorn
recycles the connection; with `Connection: close`, the body is still read (and dropped) in
the background until hypercorn's `http.disconnect`, so hypercorn gets past its queue and
closes the socket.

Imports trio only.
"""

from __future__ import annotations

import math
from typing import Any

import trio

DRAIN_TIMEOUT = 10.0  # seconds an early answer waits for the rest of the body before closing


class _Body:
    """What has been received of one request's body, through every reader's receive()."""

    def __init__(self, scope: dict[str, Any], receive: Any) -> None:
        self._receive = receive
        self.length = _declared_length(scope)
        self.ended = trio.Event()  # the last body chunk, or http.disconnect, was received
        self.disconnected = trio.Event()
        self.received = 0  # body bytes
        if self.length == 0:
            self.ended.set()

    async def receive(self) -> dict[str, Any]:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected.set()
            self.ended.set()
        elif message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.ended.set()
        return message

    async def discard_until(self, event: trio.Event, limit: float = math.inf) -> None:
        """Read and drop messages until `event` is set (by this reader or another: the app
        may be reading too, and a message goes to one reader only), or `limit` body bytes
        have been received."""
        async with trio.open_nursery() as nursery:

            async def pump() -> None:
                while self.received <= limit:
                    await self.receive()
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump)
            await event.wait()
            nursery.cancel_scope.cancel()


class BodyDrain:
    def __init__(self, app: Any, limit: int, timeout: float = DRAIN_TIMEOUT) -> None:
        self.app = app
        self.limit = limit  # the largest body the server reads (api.http.app.MAX_BODY_BYTES)
        self.timeout = timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(scope, receive)
        closing = False

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal closing
            if message["type"] == "http.response.start" and not body.ended.is_set():
                if not await self._drained(body):
                    closing = True
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            if closing and message["type"] == "http.response.body" and not message.get("more_body", False):
                async with trio.open_nursery() as nursery:
                    # hypercorn puts http.disconnect into the full queue while sending this.
                    nursery.start_soon(body.discard_until, body.disconnected)
                    await send(message)
                    with trio.move_on_after(self.timeout):
                        await body.disconnected.wait()
                    nursery.cancel_scope.cancel()
                return
            await send(message)

        await self.app(scope, body.receive, guarded_send)

    async def _drained(self, body: _Body) -> bool:
        """Read the rest of the body (up to `limit`, within `timeout`); whether it all came."""
        if body.length is not None and body.length > self.limit:
            return False
        with trio.move_on_after(self.timeout):
            await body.discard_until(body.ended, self.limit)
        return body.ended.is_set() and not body.disconnected.is_set()


def _declared_length(scope: dict[str, Any]) -> int | None:
    """The body's Content-Length; 0 for a request that has no body; None when chunked."""
    length = 0
    for name, value in scope.get("headers", ()):
        name = name.lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
    return length
