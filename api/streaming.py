"""Helpers every generation route shares: start a request, stream it as SSE, or collect it.

Owns: the rule that a streaming response starts only after the first delta arrives (so a
prompt that is too long still gets a proper 4xx, not a broken stream), and the synchronous
cleanup on client disconnect (`RequestStream` closes without awaiting, ANCHORS E1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from quart import Response

from api import sse
from runtime.engine import Runtime
from runtime.messages import FinishReason, TextDelta, Usage
from runtime.request import Prompt
from runtime.sampling import SamplingParams


@dataclass(slots=True)
class Collected:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    usage: Usage | None = None


class Generation:
    """A submitted request whose first delta has arrived."""

    def __init__(self, runtime: Runtime, prompt: Prompt, sampling: SamplingParams) -> None:
        self.stream = runtime.open(prompt, sampling)
        self.first: TextDelta | None = None

    async def start(self) -> "Generation":
        try:
            self.first = await self.stream.next()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    async def deltas(self) -> AsyncIterator[TextDelta]:
        delta = self.first
        while delta is not None:
            yield delta
            delta = await self.stream.next()

    async def collect(self) -> Collected:
        out = Collected()
        try:
            async for delta in self.deltas():
                out.text += delta.text
                out.token_ids += delta.token_ids
                if delta.finish_reason is not None:
                    out.finish_reason, out.stop_reason, out.usage = delta.finish_reason, delta.stop_reason, delta.usage
        finally:
            self.close()
        return out

    def close(self) -> None:
        self.stream.close()


def sse_response(events: AsyncIterator[bytes]) -> Response:
    return Response(events, content_type="text/event-stream", headers=sse.HEADERS)


def sse_stream(gen: Generation, render: Callable[[TextDelta], list[bytes]], tail: Callable[[], list[bytes]]) -> Response:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for delta in gen.deltas():
                for chunk in render(delta):
                    yield chunk
            for chunk in tail():
                yield chunk
        except Exception as exc:  # the engine failed this request mid-stream: say so, then end
            yield sse.data({"error": {"message": str(exc), "type": "server_error", "param": None, "code": "request_failed"}})
            yield sse.DONE
        finally:
            gen.close()

    return sse_response(body())
