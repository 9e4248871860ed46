"""One mailbox per request: where the detokenizer leaves text for the client's handler.

Owns: `DeltaMailbox`. `put` never blocks and merges with whatever the handler has not taken
yet (vLLM's RequestOutputCollector idea), so a slow client can never stall the detokenizer or
any other request. `fail` delivers an error instead. Imports trio and runtime.messages.
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
    def __init__(self) -> None:
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
        self._wakeup.set()
        if self.group is not None:
            self.group.set()

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
        if self._pending is not None:
            delta, self._pending = self._pending, None
            if delta.finish_reason is not None:
                self._drained = True
            return True, delta
        if self._error is not None:
            raise self._error
        return self._drained, None

    async def get(self) -> TextDelta | None:
        """The merged deltas since the last call; None once the final delta was taken."""
        while True:
            if self._pending is not None:
                delta, self._pending = self._pending, None
                if delta.finish_reason is not None:
                    self._drained = True
                return delta
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
