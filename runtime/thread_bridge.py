"""One dedicated OS thread for blocking work, bridged to trio; one per device, shared.

Owns: `DedicatedThread` and `DeviceThreads`. Every call runs on the same thread, in order. That
matters for torch: the current device and stream, inference mode, compiled graphs and the
intra-op thread pool settings are per thread, and `trio.to_thread` gives no thread affinity
(successive calls from one task land on different worker threads).

One thread per device, shared by every model on it, keeps one OpenMP team per device (the
comment on `DeviceThreads` says why), so a device's models must agree on `num_threads`. The
thread also gives free heap pages back to the OS between jobs every few seconds
(runtime/memory.py says why): once per thread, whatever the number of models on it.

Results come back through `TrioToken.run_sync_soon`, so the worker never blocks on the event
loop. A call whose awaiting task was cancelled still runs to completion on the thread (a step
is never abandoned half-way); its result is dropped. Imports trio, outcome and the stdlib.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import outcome
import trio

from runtime.memory import trim_heap

T = TypeVar("T")
_STOP = object()
TRIM_EVERY_S = 5.0


class DedicatedThread:
    def __init__(self, name: str, housekeeping: Callable[[], object] | None = None, every_s: float = TRIM_EVERY_S) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = False
        self._housekeeping = housekeeping  # run between jobs, at most every `every_s` seconds
        self._every_s = every_s

    def start(self) -> None:
        self._thread.start()
        self._started = True

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.submit(fn, *args).result()

    def submit(self, fn: Callable[..., T], *args: Any) -> Job[T]:
        """Queue `fn(*args)` now, behind the jobs already queued (they run in submission order,
        whichever task awaits first); await the job's `result()` for its outcome."""
        if not self._started:
            self.start()
        job: Job[T] = Job()
        self._jobs.put((fn, args, trio.lowlevel.current_trio_token(), job.deliver))
        return job

    async def stop(self) -> None:
        """Let queued work finish, then end the thread."""
        if not self._started:
            return
        self._jobs.put(_STOP)
        await trio.to_thread.run_sync(self._thread.join)

    @property
    def finished(self) -> bool:
        """Started once and gone: its trio run ended, or stop() ran."""
        return self._started and not self._thread.is_alive()

    def _main(self) -> None:
        last_housekeeping = time.monotonic()
        while True:
            if self._housekeeping is not None and time.monotonic() - last_housekeeping > self._every_s:
                self._housekeeping()
                last_housekeeping = time.monotonic()
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args, token, deliver = job
            result = outcome.capture(fn, *args)
            try:
                token.run_sync_soon(deliver, result)
            except trio.RunFinishedError:
                return


class Job(Generic[T]):
    """One queued call's outcome, delivered on the event loop by the thread."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[outcome.Outcome](1)

    def deliver(self, result: outcome.Outcome) -> None:
        try:
            self._send.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller was cancelled; nobody wants this result any more

    async def result(self) -> T:
        async with self._receive:
            result = await self._receive.receive()
        return result.unwrap()


# Why one thread per device, shared by every model on it: each OS thread that runs torch ops
# gets its own OpenMP team, and once libgomp manages more threads than there are CPUs it makes
# every team sleep instead of spin between parallel regions. A decode step is thousands of small
# regions: serving the embedding model beside the chat model on its own thread (an idle one!)
# made every chat decode step 1.9x slower on a 2-core machine (41.8 -> 78.5 ms at batch 1).
# Models on one device share its compute anyway; sharing its thread keeps one
# team. They must agree on `num_threads`: torch's intra-op pool is a setting of the thread, so
# the last model loaded would silently win; `acquire` refuses a second value.
class DeviceThreads:
    """The `DedicatedThread` of each device, shared by every runner on it: started by its first
    user, stopped when its last one releases it."""

    def __init__(self) -> None:
        self._threads: dict[str, DedicatedThread] = {}
        self._users: dict[str, int] = {}
        self._num_threads: dict[str, int | None] = {}

    def acquire(self, device: str, num_threads: int | None = None) -> DedicatedThread:
        """`device`: the resolved device (Runner.device_key), so "auto" and "cpu" share."""
        thread = self._threads.get(device)
        if thread is None or thread.finished:  # a thread whose trio run ended cannot serve this one
            self._threads[device] = thread = DedicatedThread(f"switchyard-device-{device}", housekeeping=trim_heap)
            self._users[device] = 0
            self._num_threads[device] = None
        agreed = self._num_threads[device]
        if num_threads is not None and agreed is not None and num_threads != agreed:
            raise ValueError(f"models on {device} share one device thread: num_threads {num_threads} and {agreed} cannot both hold")
        self._num_threads[device] = agreed if num_threads is None else num_threads
        self._users[device] += 1
        return thread

    async def release(self, device: str) -> None:
        self._users[device] -= 1
        if self._users[device] == 0:
            thread = self._threads.pop(device)
            del self._users[device], self._num_threads[device]
            await thread.stop()


device_threads = DeviceThreads()
