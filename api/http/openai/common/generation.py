"""`Generation`: what every generating endpoint shares: start a request on the engine, stream
it as SSE, or collect it.

Owns: the rule that a streaming response starts only after the first delta arrives (so a
prompt that is too long still gets a proper 4xx, not a broken stream), the synchronous cleanup
on client disconnect (`RequestStream.close()` never awaits: once the client is gone, any await
in a cancelled SSE generator's `finally` raises Cancelled, so cleanup that awaits never runs),
and reading the n sequences of one request (n, best_of, several prompts) as one interleaved
stream without a nursery (their mailboxes share a GroupSignal). Imports quart,
api.http.shared, api.http.openai.common and runtime.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from quart import Response

from api.http.openai.common.errors import error_body
from api.http.shared import sse
from runtime.mailbox import GroupSignal
from runtime.messages import FinishReason, Logprob, TextDelta, Usage
from runtime.protocol import Runtime
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from runtime.stream import RequestStream


@dataclass(slots=True)
class Collected:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Logprob] = field(default_factory=list)
    prompt_logprobs: list[Logprob] | None = None
    embedding: list[float] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    usage: Usage | None = None

    @property
    def cumulative_logprob(self) -> float:
        return sum(lp.logprob for lp in self.logprobs)

    def add(self, delta: TextDelta) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        if delta.logprobs:
            self.logprobs += delta.logprobs
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.embedding is not None:
            self.embedding = delta.embedding
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason, self.usage = delta.finish_reason, delta.stop_reason, delta.usage


class Generation:
    """The sequences of one request (several prompts × n), started, first delta in hand."""

    def __init__(self, runtime: Runtime, prompts: list[Prompt], sampling: SamplingParams, n: int = 1) -> None:
        self.runtime = runtime
        self.group = GroupSignal() if len(prompts) * n > 1 else None
        self.streams: list[RequestStream] = []
        try:
            for prompt in prompts:
                self.streams += runtime.open_many(prompt, sampling, n, group=self.group)
        except BaseException:
            self.close()
            raise
        self._held: list[tuple[int, TextDelta]] = []

    async def start(self) -> Generation:
        """Wait for the first delta of any sequence (errors surface here, before any header)."""
        try:
            first = await self._next_ready()
            self._held = first
        except BaseException:
            self.close()
            raise
        return self

    @property
    def request_id(self) -> str:
        return self.streams[0].request_id

    async def deltas(self) -> AsyncIterator[tuple[int, TextDelta]]:
        """(sequence index, delta) as they come, until every sequence has finished."""
        while True:
            ready = self._held or await self._next_ready()
            self._held = []
            if not ready:
                return
            for item in ready:
                yield item

    async def _next_ready(self) -> list[tuple[int, TextDelta]]:
        if self.group is None:
            delta = await self.streams[0].next()
            return [] if delta is None else [(0, delta)]
        while True:
            out: list[tuple[int, TextDelta]] = []
            live = False
            for i, stream in enumerate(self.streams):
                ready, delta = stream.ctx.mailbox.take_nowait()
                if delta is not None:
                    out.append((i, delta))
                if not ready or delta is not None and delta.finish_reason is None:
                    live = True
            if out or not live:
                return out
            await self.group.wait()

    async def collect(self) -> list[Collected]:
        outs = [Collected() for _ in self.streams]
        try:
            async for i, delta in self.deltas():
                outs[i].add(delta)
        finally:
            self.close()
        return outs

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


def sse_stream(
    gen: Generation, render: Callable[[int, TextDelta], list[bytes]], tail: Callable[[], list[bytes]]
) -> Response:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for index, delta in gen.deltas():
                for chunk in render(index, delta):
                    yield chunk
            for chunk in tail():
                yield chunk
        except Exception as exc:  # the engine failed this request mid-stream: say so, then end
            yield sse.data(error_body(str(exc), "server_error", None, "request_failed"))
            yield sse.DONE
        finally:
            gen.close()

    return sse.response(body())
