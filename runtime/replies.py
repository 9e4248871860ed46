"""Calls over a socket that wait for their replies, matched by number: `Replies`.

Owns the numbering and the waiting: `ask` numbers a call and waits for `answer` with its
number; `fail_all` wakes every waiting call with no answer (the other end is gone). Used by the
front end's side of an engine process (adapter loads: actors/engine_link.py) and by the hub of
several front ends (api/process/hub.py). Imports trio.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import trio


class Gone(Exception):
    """The other end went before it answered."""


class Replies:
    def __init__(self) -> None:
        self._numbers = itertools.count()
        self._waiting: dict[int, trio.MemorySendChannel[Any]] = {}

    async def ask(self, send: Callable[[int], Awaitable[None] | None]) -> Any:
        """`send(number)` puts the call on the wire; its answer, or `Gone`."""
        number = next(self._numbers)
        ours, theirs = trio.open_memory_channel[Any](1)
        self._waiting[number] = ours
        try:
            sent = send(number)
            if sent is not None:
                await sent
            async with theirs:
                return await theirs.receive()
        except trio.EndOfChannel:
            raise Gone from None
        finally:
            self._waiting.pop(number, None)

    def answer(self, number: int, reply: Any) -> None:
        waiting = self._waiting.pop(number, None)
        if waiting is not None:
            waiting.send_nowait(reply)

    def fail_all(self) -> None:
        for waiting in self._waiting.values():
            waiting.close()
        self._waiting.clear()
