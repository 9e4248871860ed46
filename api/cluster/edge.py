"""The HTTP edge of a serve-ray deployment, shared by both topologies (api/cluster/deploy.py):
whichever deployment Ray's HTTP proxy calls (SwitchyardIngress on the relay topology, the
model replica itself on the direct one) reads the request body with `read_body`, answers the
ASGI lifespan with `lifespan`, and forwards the replica's ASGI messages with `relay`.

`relay` owns the failure rule: when the replica fails (killed, crashed, unreachable, its
runtime's thread gone), the client gets a clean error, never a hang: before the response
started, a 503 in the shape of the API the path belongs to (api.http.app.error_shapes); mid-SSE, an
error event and `[DONE]`; otherwise the body ends. Imports api.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable, Sequence
from typing import Any

from api.http.app import error_shapes
from api.http.shared import sse
from api.http.shared.errors import HTTPError
from runtime.logging import get_logger

log = get_logger("cluster.edge")

REPLICA_FAILED = "The model replica serving this request failed; retry."
_SHAPES = error_shapes()  # the errors the edge answers itself, in the shape of the request's surface

Headers = Sequence[tuple[bytes, bytes]]


async def read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError("client left before sending its body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


class Progress:
    """How far one response has gone, from the ASGI messages sent for it."""

    def __init__(self) -> None:
        self.started = self.streaming = self.finished = False

    def saw(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in message.get("headers", ()))
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            self.finished = True


async def end_cleanly(send: Any, scope: dict[str, Any], progress: Progress, error: str) -> None:
    """The replica behind this response failed (`error`): end the response as a client can read it."""
    log.warning("replica_call_failed", path=scope.get("path"), started=progress.started, error=error[:300])
    if progress.finished:
        return
    if not progress.started:
        await _SHAPES.send(send, scope, HTTPError(503, REPLICA_FAILED, "replica_failed"), {"Retry-After": "1"})
    elif progress.streaming:
        failure = sse.data({"error": {"message": REPLICA_FAILED, "type": "server_error", "param": None, "code": "replica_failed"}}) + sse.DONE
        await send({"type": "http.response.body", "body": failure})
    else:
        await send({"type": "http.response.body", "body": b""})


async def relay(
    responses: AsyncIterable[list[dict[str, Any]]], scope: dict[str, Any], send: Any,
    extra_headers: Headers = (), on_cancel: Callable[[], Any] | None = None,
) -> None:  # fmt: skip
    """Forward a replica's batches of ASGI messages (`extra_headers` added to the response's
    start); on its failure, end the response cleanly. `on_cancel`: what stops the replica's
    call when this task is cancelled (the client left), when cancelling this task alone does not."""
    progress = Progress()
    try:
        async for batch in responses:
            for message in batch:
                progress.saw(message)
                if message["type"] == "http.response.start" and extra_headers:
                    message = {**message, "headers": [*message.get("headers", ()), *extra_headers]}
                await send(message)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        raise
    except Exception as exc:  # noqa: BLE001 - replica died, unreachable, or its call failed
        await end_cleanly(send, scope, progress, repr(exc))


async def lifespan(receive: Any, send: Any) -> None:
    """Ray's wrapper drives an ingress's ASGI lifespan; there is nothing to start or stop here
    (a replica's own app has its lifespan driven on its trio thread, api/cluster/host.py)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
