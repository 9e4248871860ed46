"""`RequestStream`: what `Runtime.submit()` / `open()` hand the API for one request.

Owns: reading a request's deltas from its mailbox, and closing it synchronously (a cancelled
handler cannot await: trio raises Cancelled at an await in a cancelled generator's finally): closing a live request aborts it in its runtime.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from runtime.messages import AbortReason, TextDelta
from runtime.request import RequestContext


class Aborts(Protocol):
    """What a stream needs of its runtime (actors/engine.py `Engine`)."""

    requests: dict[str, RequestContext]

    def abort(self, request_id: str, reason: AbortReason) -> None: ...


class RequestStream:
    """What `submit()` yields: the request's id, counters, and its deltas as an async iterator."""

    def __init__(self, runtime: Aborts, ctx: RequestContext) -> None:
        self._runtime = runtime
        self.ctx = ctx

    @property
    def request_id(self) -> str:
        return self.ctx.request_id

    async def next(self) -> TextDelta | None:
        return await self.ctx.mailbox.get()

    def close(self) -> None:
        """Abort the request if it is still live. Synchronous: safe in a cancelled scope."""
        if self.ctx.request_id in self._runtime.requests:
            self._runtime.abort(self.ctx.request_id, AbortReason.CLIENT_GONE)

    def __aiter__(self) -> AsyncIterator[TextDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TextDelta]:
        while (delta := await self.ctx.mailbox.get()) is not None:
            yield delta
