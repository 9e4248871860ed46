"""`Runtime`: the actor pipeline for one served model, and the door requests come in by.

Owns: the memory channels, starting the actors in one nursery (executor first: the model's
limits size everything else), admission control, `submit()` and the shutdown order.

    HTTP handler ──submit()──▶ tokenizer ──▶ scheduler ⇄ executor (device thread)
                                                │
                     mailbox ◀── detokenizer ◀──┘

This is the one runtime module allowed to import actors.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from actors.detokenizer import DetokenizerActor
from actors.executor import ExecutorActor
from actors.guidance import GuideCompiler
from actors.runners.base import ModelInfo, Runner
from actors.sched_core import SchedulerConfig, SchedulerCore
from actors.scheduler import SchedulerActor
from actors.tokenizer import TokenizerActor
from runtime.config import RuntimeConfig
from runtime.errors import EngineDead, Overloaded
from runtime.logging import get_logger
from runtime.messages import AbortReason, AbortRequest, TextDelta
from runtime.request import Prompt, RequestContext
from runtime.sampling import SamplingParams

log = get_logger("runtime")


class RequestStream:
    """What `submit()` yields: the request's id, counters, and its deltas as an async iterator."""

    def __init__(self, runtime: Runtime, ctx: RequestContext) -> None:
        self._runtime = runtime
        self.ctx = ctx

    @property
    def request_id(self) -> str:
        return self.ctx.request_id

    async def next(self) -> TextDelta | None:
        return await self.ctx.mailbox.get()

    def close(self) -> None:
        """Abort the request if it is still live. Synchronous: safe in a cancelled scope."""
        if self.ctx.request_id in self._runtime.requests:
            self._runtime.abort(self.ctx.request_id, AbortReason.CLIENT_GONE)

    def __aiter__(self) -> AsyncIterator[TextDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TextDelta]:
        while (delta := await self.ctx.mailbox.get()) is not None:
            yield delta


class Runtime:
    def __init__(
        self,
        config: RuntimeConfig,
        runner: Runner,
        tokenizer: Any,
        served_name: str,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.served_name = served_name
        self.task = "generate"  # what routes may send it: "generate" (chat/completions) or "embed"
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, RequestContext] = {}
        self.accepting = False
        self.info: ModelInfo | None = None
        self.max_model_len = 0
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()
        self._nursery: trio.Nursery | None = None
        self.created = int(time.time())

    # -- life cycle ---------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every actor; report ready once the model is loaded and warm; run until cancelled."""
        cfg = self.config
        plans_send, plans_recv = trio.open_memory_channel[Any](1)
        results_send, results_recv = trio.open_memory_channel[Any](1)
        # Every live request puts at most one request and one abort here, so this bound (with
        # admission capping live requests at max_pending) means a send_nowait never fails.
        sched_send, sched_recv = trio.open_memory_channel[Any](2 * cfg.max_pending + 16)
        tok_send, tok_recv = trio.open_memory_channel[Any](cfg.max_pending)
        out_send, out_recv = trio.open_memory_channel[Any](4)
        self._tokenizer_inbox = tok_send
        self._scheduler_inbox = sched_send

        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.executor = ExecutorActor(self.runner, plans_recv, results_send)
            info: ModelInfo = await nursery.start(self.executor.run)
            self.info = info
            # A request must fit in the KV cache on its own, or it could never be scheduled.
            self.max_model_len = min(info.max_model_len, info.num_kv_blocks * info.block_size)
            core = SchedulerCore(
                SchedulerConfig(
                    num_blocks=info.num_kv_blocks,
                    block_size=info.block_size,
                    max_num_seqs=cfg.max_num_seqs,
                    max_num_batched_tokens=cfg.max_num_batched_tokens,
                    max_model_len=self.max_model_len,
                    eos_token_ids=self.eos_token_ids,
                )
            )
            self.scheduler = SchedulerActor(core, sched_recv, plans_send, results_recv, out_send, self.requests)
            self.detokenizer = DetokenizerActor(
                _fast_backend(self.tokenizer), self.eos_token_ids, self.requests, out_recv, sched_send.clone(), self.served_name
            )
            guides = GuideCompiler(self.tokenizer, info.vocab_size)
            self.tokenizer_actor = TokenizerActor(self.tokenizer, self.max_model_len, tok_recv, sched_send.clone(), guides)
            await nursery.start(self.scheduler.run)
            await nursery.start(self.detokenizer.run)
            await nursery.start(self.tokenizer_actor.run)
            self.accepting = True
            log.info("runtime_ready", model=self.served_name, device=info.device, dtype=info.dtype, kv_blocks=info.num_kv_blocks, max_model_len=self.max_model_len)
            task_status.started(self)

    async def drain(self, timeout: float) -> None:
        """Stop admitting; wait up to `timeout` for live requests; abort the rest."""
        self.accepting = False
        with trio.move_on_after(timeout):
            while self.requests:
                await trio.sleep(0.05)
        for request_id in list(self.requests):
            self.abort(request_id, AbortReason.SHUTDOWN)

    def stop(self) -> None:
        """Close the pipeline's entry; each actor ends when its inbox ends."""
        self.accepting = False
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- requests -----------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        return self.info.fingerprint if self.info is not None else ""

    def health(self) -> tuple[bool, str | None]:
        """(ok, why not): the device thread is alive and no step overran its deadline."""
        if not self.accepting:
            return False, "not accepting requests"
        if not self.executor.thread.is_alive:
            return False, "device thread is dead"
        age = self.executor.step_age()
        if age > self.config.step_deadline:
            return False, f"a step has been running for {age:.1f}s"
        return True, None

    def open(self, prompt: Prompt, sampling: SamplingParams) -> RequestStream:
        """Admit a request; its deltas come from the returned stream, which must be closed.

        Raises Overloaded when `max_pending` requests are live and EngineDead when the runtime
        is not accepting.
        """
        if not self.accepting:
            raise EngineDead("The server is not accepting requests (starting up or shutting down).")
        if len(self.requests) >= self.config.max_pending:
            raise Overloaded(f"{len(self.requests)} requests are in flight; retry shortly.")
        request_id = f"{self._id_prefix}{next(self._ids):08x}"
        ctx = RequestContext(request_id=request_id, prompt=prompt, sampling=sampling, arrival_time=time.perf_counter())
        self.requests[request_id] = ctx
        try:
            self._tokenizer_inbox.send_nowait(ctx)
        except trio.WouldBlock:
            del self.requests[request_id]
            raise Overloaded("The tokenizer queue is full; retry shortly.") from None
        return RequestStream(self, ctx)

    @asynccontextmanager
    async def submit(self, prompt: Prompt, sampling: SamplingParams) -> AsyncIterator[RequestStream]:
        """`open()` as a context manager: leaving the block early aborts the request."""
        stream = self.open(prompt, sampling)
        try:
            yield stream
        finally:
            stream.close()

    def abort(self, request_id: str, reason: AbortReason) -> None:
        ctx = self.requests.pop(request_id, None)
        if ctx is None:
            return
        ctx.aborted = True
        ctx.mailbox.fail(EngineDead("The request was aborted: server shutting down.") if reason is AbortReason.SHUTDOWN else _Aborted())
        try:
            self._scheduler_inbox.send_nowait(AbortRequest(request_id, reason))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            log.error("abort_not_delivered", request_id=request_id)

    def statistics(self) -> dict[str, Any]:
        return {"live_requests": len(self.requests), **self.scheduler.statistics()}


class _Aborted(Exception):
    pass


def _fast_backend(tokenizer: Any) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None:
        raise TypeError("Switchyard needs a fast (tokenizers-backed) tokenizer")
    return backend


def build_runtime(config: RuntimeConfig) -> Runtime:
    """A Runtime on the torch runner for `config.model` (the embedded default when None)."""
    from transformers import AutoTokenizer, GenerationConfig

    from actors.runners.torch_runner import TorchRunner
    from runtime.model_store import resolve_model

    name, path = resolve_model(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    eos: set[int] = set()
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    try:
        generation = GenerationConfig.from_pretrained(path)
        ids = generation.eos_token_id
        eos.update([ids] if isinstance(ids, int) else (ids or []))
    except OSError:
        pass
    runner = TorchRunner(
        path,
        device=config.device,
        dtype=config.dtype,
        num_kv_blocks=config.num_kv_blocks,
        kv_cache_gib=config.kv_cache_gib,
        block_size=config.block_size,
        num_threads=config.num_threads,
        max_model_len=config.max_model_len,
    )
    return Runtime(config, runner, tokenizer, config.served_name or name, frozenset(eos))
