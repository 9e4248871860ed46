"""One mailbox per request: where the detokenizer leaves text for the client's handler.

Owns: `DeltaMailbox`. `put` never blocks and merges with whatever the handler has not taken
yet (vLLM's RequestOutputCollector idea), so a slow client can never stall the detokenizer or
any other request. `fail` delivers an error instead. Imports trio and runtime.messages.

`min_tokens` (`--stream-interval`, SGLang's and vLLM's name) holds a stream's text back until
that many tokens are pending, past its first delta (the first token goes at once: TTFT is
unchanged) and but for its last: where a step takes a few ms, every chunk's trip through the
event loop and the HTTP stack takes turns with the device thread on the GIL and bounds the
server (docs/performance.md, "Server overhead"), so fewer, larger chunks buy throughput at the
price of a burstier stream.
"""

from __future__ import annotations

import msgspec
import trio

from runtime.messages import TextDelta


class GroupSignal:
    """One wake-up shared by several mailboxes, so one reader can wait on all of them at once
    without a nursery (the SSE generator must not open one around a yield, PEP 789)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


class DeltaMailbox:
    def __init__(self, min_tokens: int = 1) -> None:
        self.min_tokens = min_tokens
        self._delivered = False  # a delta with tokens was taken (the first never waits for min_tokens)
        self._pending: TextDelta | None = None
        self._error: BaseException | None = None
        self._finished = False  # a delta with finish_reason was put
        self._drained = False  # ...and taken
        self._wakeup = trio.Event()
        self.group: GroupSignal | None = None  # shared by the n sequences of one request

    @property
    def finished(self) -> bool:
        return self._finished or self._error is not None

    def put(self, delta: TextDelta) -> None:
        if self.finished:
            return
        self._pending = delta if self._pending is None else _merged(self._pending, delta)
        if delta.finish_reason is not None:
            self._finished = True
        if not self._due():
            return  # held until min_tokens are pending: nobody is woken for it
        self._wakeup.set()
        if self.group is not None:
            self.group.set()

    def _due(self) -> bool:
        """Whether what is pending goes to the handler now (anything does once min_tokens is 1)."""
        pending = self._pending
        if pending is None:
            return False
        return (
            self.min_tokens <= 1 or not self._delivered or pending.finish_reason is not None or self._error is not None
            or not pending.token_ids or len(pending.token_ids) >= self.min_tokens
        )  # fmt: skip

    def _take(self) -> TextDelta:
        delta, self._pending = self._pending, None
        assert delta is not None
        self._delivered = self._delivered or bool(delta.token_ids)
        if delta.finish_reason is not None:
            self._drained = True
        return delta

    def fail(self, error: BaseException) -> None:
        if self.finished:
            return
        self._error = error
        self._wakeup.set()
        if self.group is not None:
            self.group.set()

    def take_nowait(self) -> tuple[bool, TextDelta | None]:
        """(ready, delta): what get() would return right now, without waiting.

        ready is False when nothing is pending and the stream is not over. Raises the error a
        failed mailbox holds.
        """
        if self._due():
            return True, self._take()
        if self._error is not None:
            raise self._error
        return self._drained, None

    async def get(self) -> TextDelta | None:
        """The merged deltas since the last call; None once the final delta was taken."""
        while True:
            if self._due():
                return self._take()
            if self._error is not None:
                raise self._error
            if self._drained:
                return None
            self._wakeup = trio.Event()
            await self._wakeup.wait()


def _merged(pending: TextDelta, delta: TextDelta) -> TextDelta:
    """One delta saying what `pending` then `delta` say (both are frozen: a new one)."""
    logprobs = pending.logprobs
    if delta.logprobs is not None:
        logprobs = [*(logprobs or ()), *delta.logprobs]
    return msgspec.structs.replace(
        delta,
        text=pending.text + delta.text,
        token_ids=[*pending.token_ids, *delta.token_ids],
        logprobs=logprobs,
        prompt_logprobs=delta.prompt_logprobs if delta.prompt_logprobs is not None else pending.prompt_logprobs,
        embedding=delta.embedding if delta.embedding is not None else pending.embedding,
    )
