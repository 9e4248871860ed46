"""The engine in its own process (`--engine-process`): one served model's scheduler and executor
(with its device thread), so the front end's Python never takes turns with the step's on one GIL.

Owns the child's life: the config the front end passed (its environment), the model loaded as
`build_engine` loads it, then one trio loop: the two actors as in one process, a reader per
front end (`--api-servers`: a socket each, the first the parent's: new requests, their grammar
matchers compiled here from the guides their sampling parameters carry, cached per guide;
aborts, landing before the next step; LoRA adapters to load or unload; the stop, the parent's
only) and one writer (a message a
step to each front end: the outputs of the requests it sent, the scheduler's counters, and to
the parent the steps' sizes and times for the metrics; the counters alone when they change
between steps). A front end that goes has its requests aborted. It exits when the parent's
socket closes (the parent gone: the kernel closes its end), after the stop (the step in
flight finished, the runner closed), or on a crash, reported first (`Failed`), 1.
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
from actors.lora_control import forget_in, load_into
from actors.scheduler import SchedulerActor
from runtime.config import RuntimeConfig
from runtime.engine_wire import CONFIG_ENV, FD_ENV, Abort, AdapterCall, AdapterDone, Failed, Frames, Ready, Step, Stop, Submit, ToEngine, frame
from runtime.errors import ModelRefused
from runtime.logging import configure_logging, get_logger
from runtime.messages import AbortReason, AbortRequest, DropRequests, Shutdown, StepOutputs, TokenDelta, TokenizedRequest

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
    socks = [socket.socket(fileno=int(fd)) for fd in os.environ[FD_ENV].split(",")]
    try:
        trio.run(serve, config, socks)
    except BaseException as exc:  # noqa: BLE001 - reported to the front end, then exit 1
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        log.error("engine_process_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        _last_word(socks, Failed(error=f"{type(exc).__name__}: {exc}", refused=isinstance(exc, ModelRefused | ValueError)))
        sys.exit(1)
    sys.stdout.flush()
    os._exit(0)  # as the server does: interpreter finalization with torch loaded takes seconds


async def serve(config: RuntimeConfig, socks: list[socket.socket]) -> None:
    streams = [trio.SocketStream(trio.socket.from_stdlib_socket(sock)) for sock in socks]
    engine = build_engine(config)
    plans_send, plans_recv = trio.open_memory_channel[Any](1)
    results_send, results_recv = trio.open_memory_channel[Any](1)
    requests_send, requests_recv = trio.open_memory_channel[Any](len(streams) * (config.max_pending + 16))
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
        for stream in streams:
            await stream.send_all(frame(Ready(info=info, counters=scheduler.statistics())))
        reading, writer = trio.CancelScope(), _Writer(streams, scheduler, steps)
        control = _Control(engine.runner, executor.thread, config.max_lora_rank, writer)
        nursery.start_soon(_read_all, streams, requests_send, aborts_send, guides, reading, control)
        await writer.relay(out_recv)
        reading.cancel()


async def _read_all(
    streams: list[trio.SocketStream], requests: trio.MemorySendChannel[Any], aborts: trio.MemorySendChannel[Any], guides: GuideCompiler, scope: trio.CancelScope,
    control: _Control,
) -> None:  # fmt: skip
    with scope:
        async with trio.open_nursery() as nursery, requests, aborts:
            control.nursery = nursery
            nursery.start_soon(control.writer.watch)
            for index, stream in enumerate(streams):
                nursery.start_soon(_read, index, stream, requests.clone(), aborts.clone(), guides, control)


async def _read(
    index: int, stream: trio.SocketStream, requests: trio.MemorySendChannel[Any], aborts: trio.MemorySendChannel[Any], guides: GuideCompiler, control: _Control,
) -> None:  # fmt: skip
    """One front end's messages. The parent's socket closing ends the process; another's, its requests."""
    writer, frames = control.writer, Frames(ToEngine)
    async with requests, aborts:
        while data := await _receive(stream):
            for message in frames.feed(data):
                if isinstance(message, Submit):  # a request and its siblings reach the scheduler together, as in one process
                    group = [await _with_matcher(request, guides) for request in message.requests]
                    for request in group:
                        writer.claim(request.request_id, index)
                        requests.send_nowait(request)  # room: each front end admits at most max_pending
                elif isinstance(message, Abort):
                    aborts.send_nowait(AbortRequest(message.request_id, message.reason))
                elif isinstance(message, AdapterCall):  # in its own task: aborts behind it must land
                    control.nursery.start_soon(control.adapter, index, message)
                elif isinstance(message, Stop) and index == 0:
                    await requests.send(Shutdown())
        if index == 0:  # the parent is gone: nothing will read what comes
            os._exit(0)
        writer.gone.add(index)
        for request_id in [r for r, owner in writer.owner.items() if owner == index]:
            aborts.send_nowait(AbortRequest(request_id, AbortReason.CLIENT_GONE))
        await stream.aclose()  # its link, stopping, reads the end


async def _receive(stream: trio.SocketStream) -> bytes:
    try:
        return await stream.receive_some(1 << 16)
    except trio.BrokenResourceError:  # reset: the front end went without closing, as an end
        return b""


async def _with_matcher(request: TokenizedRequest, guides: GuideCompiler) -> TokenizedRequest:
    guide = request.sampling.guide
    if guide is None:
        return request
    matcher = guides.cached(guide) or await trio.to_thread.run_sync(guides.matcher, guide)
    return msgspec.structs.replace(request, matcher=matcher)


class _Control:
    """LoRA adapters loaded and unloaded at run time, here where the runner lives (actors/lora_control.py)."""

    def __init__(self, runner: Any, thread: Any, max_rank: int, writer: _Writer) -> None:
        self.runner, self.thread, self.max_rank, self.writer = runner, thread, max_rank, writer
        self.nursery: trio.Nursery

    async def adapter(self, index: int, message: AdapterCall) -> None:
        try:
            if message.path is None:
                await forget_in(self.runner, self.thread, message.name)
            else:
                await load_into(self.runner, self.thread, message.name, message.path, self.max_rank)
            done = AdapterDone(message.call)
        except KeyError:
            done = AdapterDone(message.call, missing=True)
        except ValueError as exc:
            done = AdapterDone(message.call, error=str(exc))
        await self.writer.reply(index, done)


class _Writer:
    """The sockets' one writer: a message a step to each front end with outputs in it (the
    outputs of the requests it sent, the scheduler's counters; to the parent always, with the
    steps run since, for the metrics), and the counters alone to each when they change between
    steps (a finished request leaves the scheduler's core after its last step's message),
    checked every 50 ms."""

    def __init__(self, streams: list[trio.SocketStream], scheduler: SchedulerActor, steps: list[tuple[int, float, bool]]) -> None:
        self.streams, self.scheduler, self.steps = streams, scheduler, steps
        self.owner: dict[str, int] = {}  # request id -> the front end that sent it, until it ends
        self.gone: set[int] = set()  # front ends whose socket closed
        self._lock = trio.Lock()
        self._sent: dict[str, int] = {}

    def claim(self, request_id: str, index: int) -> None:
        """A request came from front end `index` (its outputs go there); one front end owns all."""
        if len(self.streams) > 1:
            self.owner[request_id] = index

    async def send(self, outputs: StepOutputs | None = None, dropped: list[str] | None = None) -> None:
        async with self._lock:
            self._sent = counters = self.scheduler.statistics()  # a dozen ints: /metrics reads the latest
            done, self.steps[:] = list(self.steps), []
            quiet = outputs is None and dropped is None  # the counters alone: to every front end
            for index, (mine, drops) in enumerate(self._split(outputs, dropped or [])):
                if index in self.gone or (index and not quiet and mine is None and not drops):
                    continue
                await _send_or_lose(self.streams[index], frame(Step(outputs=mine, dropped=drops, steps=[] if index else done, counters=counters)), index, self.gone)

    def _split(self, outputs: StepOutputs | None, dropped: list[str]) -> list[tuple[StepOutputs | None, list[str]]]:
        """Each front end's share of a step's outputs and drops (one front end: all of it, as it is)."""
        if len(self.streams) == 1:
            return [(outputs, dropped)]
        items: list[list[TokenDelta]] = [[] for _ in self.streams]
        drops: list[list[str]] = [[] for _ in self.streams]
        for delta in outputs.items if outputs is not None else ():
            owner = self.owner.pop(delta.request_id, 0) if delta.finish_reason is not None else self.owner.get(delta.request_id, 0)
            items[owner].append(delta)
        for request_id in dropped:
            drops[self.owner.pop(request_id, 0)].append(request_id)
        return [(StepOutputs(step_id=outputs.step_id, items=mine) if outputs is not None and mine else None, gone) for mine, gone in zip(items, drops, strict=True)]

    async def reply(self, index: int, message: AdapterDone) -> None:
        async with self._lock:
            if index not in self.gone:
                await _send_or_lose(self.streams[index], frame(message), index, self.gone)

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


async def _send_or_lose(stream: trio.SocketStream, data: bytes, index: int, gone: set[int]) -> None:
    """The parent's socket failing fails the engine; another front end's is dropped (its reader aborts its requests)."""
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        if index == 0:
            raise
        gone.add(index)


def _last_word(socks: list[socket.socket], message: Failed) -> None:
    for sock in socks:
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
