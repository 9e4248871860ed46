"""One dedicated OS thread for blocking work, bridged to trio.

Owns: `DedicatedThread`. Every call runs on the same thread, in order. That matters for torch:
the current device and stream, inference mode, compiled graphs and the intra-op thread pool
settings are per thread, and `trio.to_thread` gives no thread affinity (ANCHORS E4).

Results come back through `TrioToken.run_sync_soon`, so the worker never blocks on the event
loop. A call whose awaiting task was cancelled still runs to completion on the thread (a step
is never abandoned half-way); its result is dropped. Imports trio, outcome and the stdlib.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")
_STOP = object()


class DedicatedThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = False

    def start(self) -> None:
        self._thread.start()
        self._started = True

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if not self._started:
            self.start()
        token = trio.lowlevel.current_trio_token()
        send, receive = trio.open_memory_channel[outcome.Outcome](1)

        def deliver(result: outcome.Outcome) -> None:
            try:
                send.send_nowait(result)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the caller was cancelled; nobody wants this result any more

        self._jobs.put((fn, args, token, deliver))
        async with receive:
            result = await receive.receive()
        return result.unwrap()

    async def stop(self) -> None:
        """Let queued work finish, then end the thread."""
        if not self._started:
            return
        self._jobs.put(_STOP)
        await trio.to_thread.run_sync(self._thread.join)

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args, token, deliver = job
            result = outcome.capture(fn, *args)
            try:
                token.run_sync_soon(deliver, result)
            except trio.RunFinishedError:
                return
