"""The front end's side of an engine process (`--engine-process`): `EngineLink`.

Owns the child (actors/engine_process.py: started with the model's config, watched, stopped)
and the socket to it, and stands in the engine for the scheduler and executor that live there:
`inbox` takes what the tokenizer, the detokenizer and the engine send the scheduler (requests,
aborts, the stop; never blocking, as `SchedulerInbox`), written to the socket in order by one
task; what comes back each step goes to the detokenizer as in one process, each request's
first delta given back the mailbox that stayed here. The step hooks (metrics) run on the steps
it reports; health reads the child's life and how long it has been silent with work in flight.
The child gone without a stop fails the engine (`EngineDied`): every open stream ends with a
clean error and /health says why. With `--api-servers N` the parent's link makes one socket
more for each other front end (`spare`, handed to them by api/process/front_ends.py), whose
links attach to the running child (`ATTACH_ENV`) instead of starting one; their stop closes
only their socket (the child aborts what they left).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from runtime.config import RuntimeConfig
from runtime.engine_wire import (
    ATTACH_ENV,
    CONFIG_ENV,
    FD_ENV,
    Abort,
    AdapterCall,
    AdapterDone,
    Failed,
    Frames,
    Ready,
    Step,
    Stop,
    Submit,
    ToFront,
    attach_key,
    frame,
)
from runtime.errors import ModelRefused
from runtime.logging import get_logger
from runtime.messages import AbortReason, DropRequests, StepOutputs, TokenizedRequest
from runtime.protocol import ModelInfo
from runtime.replies import Gone, Replies

log = get_logger("runtime")


class EngineDied(RuntimeError):
    pass


class _Tally(msgspec.Struct, frozen=True):
    """A step as the step hooks read it (runtime/metrics.py reads `num_tokens`)."""

    num_tokens: int


class RemoteInbox:
    """`SchedulerInbox` across the socket: requests (bounded, as there), aborts and the stop,
    queued in order for the writer; `clone` shares it (the stop is sent once, by the engine)."""

    def __init__(self, link: EngineLink, capacity: int) -> None:
        self._link, self._capacity = link, capacity

    def clone(self) -> RemoteInbox:
        return self

    def submit(self, requests: list[TokenizedRequest]) -> bool:
        link = self._link
        if link.queued_requests + len(requests) > self._capacity or link.closed:
            return False
        for request in requests:
            link.mailboxes[request.request_id] = request.mailbox
        link.queued_requests += len(requests)
        link.send(Submit([msgspec.structs.replace(r, mailbox=None, matcher=None) for r in requests]), len(requests))
        return True

    def can_admit(self, live: int, n: int) -> bool:
        return not self._link.closed

    def abort(self, request_id: str, reason: AbortReason) -> None:
        if self._link.closed:
            raise trio.ClosedResourceError
        self._link.mailboxes.pop(request_id, None)
        self._link.send(Abort(request_id, reason))

    def shutdown(self) -> bool:
        if self._link.closed:
            return False
        self._link.send(Stop())
        return True

    async def __aenter__(self) -> RemoteInbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


class EngineLink:
    """The child process and the socket; `run` until the child exits."""

    def __init__(self, config: RuntimeConfig, outputs: trio.MemorySendChannel[Any], on_step: list[Callable[..., None]]) -> None:
        self.config, self.outputs, self.on_step = config, outputs, on_step
        self.inbox = RemoteInbox(self, config.max_pending + 16)
        self.mailboxes: dict[str, Any] = {}
        self.queued_requests = 0
        self.closed = False
        self.counters: dict[str, int] = {}
        self.last_heard = time.monotonic()
        self._queue_send, self._queue = trio.open_memory_channel[tuple[bytes, int]](math.inf)
        self._stopping = False
        self.process: trio.Process | None = None
        self._replies = Replies()  # adapter calls waiting for their AdapterDone
        self.spare: list[socket.socket] = []  # the other front ends' ends (`--api-servers`), until handed on
        fd = msgspec.json.decode(os.environ.get(ATTACH_ENV, "{}"), type=dict[str, int]).get(attach_key(config))
        self.attached = socket.socket(fileno=fd) if fd is not None else None  # another front end: the child runs already

    async def adapter(self, name: str, path: str | None) -> None:
        """Load (`path`) or unload a LoRA adapter in the engine process: as actors/lora_control.py's
        `load_into` / `forget_in`, whose ValueError or KeyError it raises here."""
        try:
            done: AdapterDone = await self._replies.ask(lambda call: self.send(AdapterCall(call, name, path)))
        except Gone:
            raise EngineDied("the engine process went while loading an adapter") from None
        if done.missing:
            raise KeyError(name)
        if done.error is not None:
            raise ValueError(done.error)

    def send(self, message: Submit | Abort | Stop | AdapterCall, requests: int = 0) -> None:
        self._stopping |= isinstance(message, Stop)
        self._queue_send.send_nowait((frame(message), requests))

    async def run(self, task_status: trio.TaskStatus[ModelInfo] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.attached is not None:
                ours = self.attached
            else:
                pairs = [socket.socketpair() for _ in range(max(1, self.config.api_servers))]
                (ours, _), self.spare = pairs[0], [pair[0] for pair in pairs[1:]]
                theirs = [pair[1].fileno() for pair in pairs]
                env = {**os.environ, CONFIG_ENV: msgspec.json.encode(self.config).decode(), FD_ENV: ",".join(map(str, theirs))}
                env.pop(ATTACH_ENV, None)
                command = [sys.executable, "-m", "actors.engine_process"]
                self.process = await nursery.start(lambda task_status: trio.run_process(command, env=env, pass_fds=theirs, check=False, task_status=task_status))
                for pair in pairs:
                    pair[1].close()
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
            frames = Frames(ToFront)
            try:
                info = await self._ready(stream, frames)
                task_status.started(info)
                nursery.start_soon(self._write, stream)
                await self._read(stream, frames)
            finally:
                self.closed = True
                self._replies.fail_all()  # adapter calls: the engine will not answer
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await stream.aclose()
                    await self._reap()

    async def _ready(self, stream: trio.SocketStream, frames: Frames) -> ModelInfo:
        while True:
            data = await stream.receive_some(1 << 16)
            if not data:
                raise EngineDied("the engine process exited while loading the model (its log has the details)")
            for message in frames.feed(data):
                if isinstance(message, Ready):
                    self.counters = message.counters
                    return message.info
                if isinstance(message, Failed):
                    raise (ModelRefused if message.refused else EngineDied)(message.error)

    async def _write(self, stream: trio.SocketStream) -> None:
        async for data, requests in self._queue:
            if self.attached is not None and self._stopping:  # not ours to stop: leave, and the child forgets us
                await stream.send_eof()
                return
            await stream.send_all(data)
            self.queued_requests -= requests

    async def _read(self, stream: trio.SocketStream, frames: Frames) -> None:
        async with self.outputs:
            while data := await stream.receive_some(1 << 16):
                self.last_heard = time.monotonic()
                for message in frames.feed(data):
                    if isinstance(message, Step):
                        await self._step(message)
                    elif isinstance(message, AdapterDone):
                        self._replies.answer(message.call, message)
                    elif isinstance(message, Failed):
                        raise EngineDied(f"the engine process failed: {message.error}")
        if not self._stopping:
            raise EngineDied("the engine process exited without being asked to")

    async def _step(self, message: Step) -> None:
        for tokens, elapsed, failed in message.steps:
            for hook in self.on_step:
                hook(_Tally(tokens), elapsed, failed)
        if message.counters is not None:
            self.counters = message.counters
        if message.outputs is not None:
            await self.outputs.send(StepOutputs(step_id=message.outputs.step_id, items=[self._mailed(d) for d in message.outputs.items]))
        if message.dropped:
            for request_id in message.dropped:
                self.mailboxes.pop(request_id, None)
            await self.outputs.send(DropRequests(message.dropped))

    def _mailed(self, delta: Any) -> Any:
        if delta.register is None:
            return delta
        mailbox = self.mailboxes.pop(delta.request_id, None)
        return msgspec.structs.replace(delta, register=msgspec.structs.replace(delta.register, mailbox=mailbox))

    async def _reap(self) -> None:
        """The child exits on its own after a stop or once its socket closes; past a few seconds, killed."""
        if self.process is None:
            return
        with trio.move_on_after(self.config.drain_timeout + 10):
            await self.process.wait()
            return
        self.process.kill()
        await self.process.wait()

    # -- what the engine reads of the executor and scheduler ----------------------------------

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None and not self.closed

    def statistics(self) -> dict[str, int]:
        return dict(self.counters)


def spawn_error(config: RuntimeConfig) -> str | None:
    """Why this model cannot run in an engine process yet, or None."""
    if config.enable_lora and config.lora_dir and config.api_servers > 1:
        return "--api-servers and --lora-dir: adapters loaded at run time are not shared by several front ends yet (start it with one, or name the adapters with --lora-modules)"
    return None

