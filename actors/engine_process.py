"""The engine in its own process (`--engine-process`): one served model's scheduler and executor
(with its device thread), so the front end's Python never takes turns with the step's on one GIL.

Owns the child's life: the config the front end passed (its environment), the model loaded as
`build_engine` loads it, then one trio loop: the two actors as in one process, a reader (new
requests, their grammar matchers compiled here from the guides their sampling parameters carry,
cached per guide; aborts, landing before the next step; the stop) and a writer (one message a
step: the scheduler's outputs for the front end's detokenizer, the steps' sizes and times, the
scheduler's counters; the counters alone when they change between steps). It exits when the
front end's socket closes (the parent gone: the kernel closes its end), after the stop
(the step in flight finished, the runner closed), or on a crash, reported first (`Failed`), 1.
Run as `python -m actors.engine_process` by actors/engine_link.py.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
from typing import Any

import msgspec
import trio

from actors.build import build_engine
from actors.executor import ExecutorActor
from actors.guidance import GuideCompiler
from actors.scheduler import SchedulerActor
from runtime.config import RuntimeConfig
from runtime.engine_wire import CONFIG_ENV, FD_ENV, Abort, Failed, Frames, Ready, Step, Stop, Submit, ToEngine, frame
from runtime.errors import ModelRefused
from runtime.logging import configure_logging, get_logger
from runtime.messages import AbortRequest, DropRequests, Shutdown, StepOutputs, TokenizedRequest

log = get_logger("engine_process")


def main() -> None:
    config = msgspec.json.decode(os.environ[CONFIG_ENV], type=RuntimeConfig)
    configure_logging(config.log_level)
    # The front end drains and stops it: a Ctrl-C or a SIGTERM sent to the whole process group
    # must not end the steps under the drain.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _orphaned():
        os._exit(1)
    sock = socket.socket(fileno=int(os.environ[FD_ENV]))
    try:
        trio.run(serve, config, sock)
    except BaseException as exc:  # noqa: BLE001 - reported to the front end, then exit 1
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        log.error("engine_process_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        _last_word(sock, Failed(error=f"{type(exc).__name__}: {exc}", refused=isinstance(exc, ModelRefused | ValueError)))
        sys.exit(1)
    sys.stdout.flush()
    os._exit(0)  # as the server does: interpreter finalization with torch loaded takes seconds


async def serve(config: RuntimeConfig, sock: socket.socket) -> None:
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    engine = build_engine(config)
    plans_send, plans_recv = trio.open_memory_channel[Any](1)
    results_send, results_recv = trio.open_memory_channel[Any](1)
    requests_send, requests_recv = trio.open_memory_channel[Any](config.max_pending + 16)
    aborts_send, aborts_recv = trio.open_memory_channel[Any](math.inf)  # every abort lands, before the next step
    out_send, out_recv = trio.open_memory_channel[Any](4)
    executor = ExecutorActor(engine.runner, plans_recv, results_send, num_threads=config.num_threads)
    steps: list[tuple[int, float, bool]] = []
    executor.on_step.append(lambda plan, elapsed, failed: steps.append((plan.num_tokens, elapsed, failed)))
    async with trio.open_nursery() as nursery:
        info = await nursery.start(executor.run)
        engine.max_model_len = min(info.max_model_len, info.num_kv_blocks * info.block_size)
        scheduler = SchedulerActor(engine.make_core(info), requests_recv, plans_send, results_recv, out_send, aborts_recv, async_scheduling=config.async_scheduling)
        await nursery.start(scheduler.run)
        guides = GuideCompiler(engine.tokenizer, info.vocab_size)
        await trio.to_thread.run_sync(guides.warm)
        await stream.send_all(frame(Ready(info=info, counters=scheduler.statistics())))
        reading, writer = trio.CancelScope(), _Writer(stream, scheduler, steps)
        nursery.start_soon(_read, stream, requests_send, aborts_send, guides, reading, writer)
        await writer.relay(out_recv)
        reading.cancel()


async def _read(
    stream: trio.SocketStream, requests: trio.MemorySendChannel[Any], aborts: trio.MemorySendChannel[Any], guides: GuideCompiler, scope: trio.CancelScope,
    writer: _Writer,
) -> None:  # fmt: skip
    frames = Frames(ToEngine)
    with scope:
        async with trio.open_nursery() as watching, requests, aborts:
            watching.start_soon(writer.watch)
            while data := await stream.receive_some(1 << 16):
                for message in frames.feed(data):
                    if isinstance(message, Submit):  # a request and its siblings reach the scheduler together, as in one process
                        group = [await _with_matcher(request, guides) for request in message.requests]
                        for request in group:
                            requests.send_nowait(request)  # room: the front end admits at most max_pending
                    elif isinstance(message, Abort):
                        aborts.send_nowait(AbortRequest(message.request_id, message.reason))
                    elif isinstance(message, Stop):
                        await requests.send(Shutdown())
            # The front end is gone (its end of the socket closed): nothing will read what comes.
            os._exit(0)


async def _with_matcher(request: TokenizedRequest, guides: GuideCompiler) -> TokenizedRequest:
    guide = request.sampling.guide
    if guide is None:
        return request
    matcher = guides.cached(guide) or await trio.to_thread.run_sync(guides.matcher, guide)
    return msgspec.structs.replace(request, matcher=matcher)


class _Writer:
    """The socket's one writer: a message a step (the scheduler's outputs, the steps run since,
    its counters), and the counters alone when they change between steps (a finished request
    leaves the scheduler's core after its last step's message), checked every 50 ms."""

    def __init__(self, stream: trio.SocketStream, scheduler: SchedulerActor, steps: list[tuple[int, float, bool]]) -> None:
        self.stream, self.scheduler, self.steps = stream, scheduler, steps
        self._lock = trio.Lock()
        self._sent: dict[str, int] = {}

    async def send(self, outputs: StepOutputs | None = None, dropped: list[str] | None = None) -> None:
        async with self._lock:
            self._sent = counters = self.scheduler.statistics()  # a dozen ints: /metrics reads the latest
            done, self.steps[:] = list(self.steps), []
            await self.stream.send_all(frame(Step(outputs=outputs, dropped=dropped or [], steps=done, counters=counters)))

    async def relay(self, outputs: trio.MemoryReceiveChannel[Any]) -> None:
        async for message in outputs:
            if isinstance(message, StepOutputs):
                await self.send(outputs=message)
            elif isinstance(message, DropRequests):
                await self.send(dropped=list(message.request_ids))

    async def watch(self) -> None:
        while True:
            await trio.sleep(0.05)
            if self.scheduler.statistics() != self._sent:
                await self.send()


def _last_word(sock: socket.socket, message: Failed) -> None:
    try:
        sock.setblocking(True)
        sock.sendall(frame(message))
    except OSError:
        pass


def _orphaned() -> bool:
    """Whether the front end died before this process could read its socket. (Not Linux's
    PR_SET_PDEATHSIG: it fires when the *thread* that spawned the child exits, and trio spawns
    from a worker thread that exits after 10 s idle: the engine died 10 s into every lull.)"""
    return os.getppid() == 1


if __name__ == "__main__":
    main()
