"""One mailbox per request: where the detokenizer leaves text for the client's handler.

Owns: `DeltaMailbox`. `put` never blocks and merges with whatever the handler has not taken
yet (vLLM's RequestOutputCollector idea), so a slow client can never stall the detokenizer or
any other request. `fail` delivers an error instead. Imports trio and runtime.messages.
"""

from __future__ import annotations

import trio

from runtime.messages import TextDelta


class DeltaMailbox:
    def __init__(self) -> None:
        self._pending: TextDelta | None = None
        self._error: BaseException | None = None
        self._finished = False  # a delta with finish_reason was put
        self._drained = False  # ...and taken
        self._wakeup = trio.Event()

    @property
    def finished(self) -> bool:
        return self._finished or self._error is not None

    def put(self, delta: TextDelta) -> None:
        if self.finished:
            return
        if self._pending is None:
            self._pending = TextDelta(text=delta.text, token_ids=list(delta.token_ids))
        else:
            self._pending.text += delta.text
            self._pending.token_ids.extend(delta.token_ids)
        if delta.finish_reason is not None:
            self._pending.finish_reason = delta.finish_reason
            self._pending.stop_reason = delta.stop_reason
            self._pending.usage = delta.usage
            self._finished = True
        self._wakeup.set()

    def fail(self, error: BaseException) -> None:
        if self.finished:
            return
        self._error = error
        self._wakeup.set()

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
