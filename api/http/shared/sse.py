"""Server-sent events: the `data:` and `event:` framing, the `[DONE]` sentinel, and the response
that streams them. Imports msgspec and quart."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from quart import Response

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_encode = msgspec.json.Encoder().encode


def data(payload: object) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def event(name: str, payload: object) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(payload) + b"\n\n"


def response(events: AsyncIterator[bytes]) -> Response:
    """A streamed text/event-stream response of `events`, unbuffered by proxies."""
    return Response(events, content_type="text/event-stream", headers=HEADERS)
