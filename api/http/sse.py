"""Server-sent events framing. Owns the `data:` lines, the `[DONE]` sentinel and error events."""

from __future__ import annotations

import msgspec

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_encode = msgspec.json.Encoder().encode


def data(payload: object) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def event(name: str, payload: object) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(payload) + b"\n\n"
