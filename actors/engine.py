"""`Engine`: the actor pipeline for one served model, and the door requests come in by.

Owns: the memory channels, starting the actors in one nursery (executor first: the model's limits size
everything else), admission control, `submit()`, the shutdown order, and the tokenizer's services to the
API (`encode`, `decode`: served by the tokenizer actor, off the event loop).

    HTTP handler ──submit()──▶ tokenizer ──▶ scheduler ⇄ executor (device thread)
                                                │
                     mailbox ◀── detokenizer ◀──┘

The engine's wiring: it sits above the actors, and the layers above it see it only as `runtime.protocol.Runtime` (built by `actors/build.py`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import structlog
import trio

from actors.core_setup import make_core
from actors.detokenizer import DetokenizerActor
from actors.embed_core import EmbeddingSchedulerCore
from actors.engine_link import EngineLink
from actors.executor import ExecutorActor
from actors.guidance import GuideCompiler
from actors.lora_control import AdapterMethods
from actors.multimodal import ImagePrompts
from actors.runners.base import Runner
from actors.sched_core import SchedulerCore
from actors.scheduler import SchedulerActor, SchedulerInbox
from actors.tokenizer import TokenizerActor
from runtime.admission import TokenBudget, estimate_tokens, is_full
from runtime.config import RuntimeConfig
from runtime.errors import EngineDead, InvalidRequest, Overloaded
from runtime.generation_defaults import SamplingDefaults
from runtime.logging import get_logger
from runtime.mailbox import DeltaMailbox, GroupSignal
from runtime.messages import AbortReason
from runtime.protocol import ModelInfo
from runtime.reasoning import detect_thinking
from runtime.request import Prompt, RequestContext
from runtime.sampling import SamplingParams
from runtime.stream import RequestStream
from runtime.tool_formats import detect_tool_format

log = get_logger("runtime")
RESTARTS = 5  # an engine process started again after dying, at most this many times an hour

try:
    _ENGINE_VERSION = importlib.metadata.version("switchyard")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    _ENGINE_VERSION = "dev"


class Engine(AdapterMethods):
    """One served model's actor pipeline; implements `runtime.protocol.Runtime`."""

    def __init__(
        self,
        config: RuntimeConfig,
        runner: Runner,
        tokenizer: Any,
        served_name: str,
        eos_token_ids: frozenset[int],
        images: ImagePrompts | None = None, sampling_defaults: SamplingDefaults | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.served_name = served_name
        self.task = "embed" if config.task == "embeddings" else "generate"  # what routes may send it
        self.eos_token_ids = eos_token_ids
        self.images = images
        # Images a prompt may carry: 0 for a model that reads text only (the edge refuses them).
        self.max_images_per_prompt = config.limit_images_per_prompt if images is not None else 0
        self.step_stretch = config.stretch_for(reads_images=self.max_images_per_prompt > 0)  # "auto" resolved
        self.sampling_defaults = sampling_defaults or SamplingDefaults()  # its generation_config's (--generation-config)
        self.thinking = detect_thinking(tokenizer, config.reasoning_parser, config.reasoning_budgets) if self.task == "generate" else None
        self.tool_format = detect_tool_format(tokenizer, config.tool_call_parser) if self.task == "generate" else ""
        # Live requests, from open() until aborted or done. Only the runtime adds or removes
        # entries (the detokenizer reports a finish through _forget); no actor holds the dict.
        self.requests: dict[str, RequestContext] = {}
        self.accepting = False
        self.dead_reason: str | None = None  # set when an actor crashed: the runtime is gone
        self.stopping = False
        self.info: ModelInfo | None = None
        self.max_model_len = 0
        self._ids, self._id_prefix = itertools.count(), os.urandom(4).hex()
        self._nursery: trio.Nursery | None = None
        self.created = int(time.time())
        # Hooks (runtime/metrics.py): on_finish(ctx, finish_reason, now) once per finished
        # request, from the detokenizer; on_step(plan, elapsed, failed) once per step, from the
        # executor. Synchronous and cheap: they run on the event loop's hot path.
        self.on_finish: list[Callable[..., None]] = []
        self.on_step: list[Callable[..., None]] = []
        self._budget = TokenBudget(config.max_pending_tokens)
        self.link: EngineLink | None = None  # --engine-process: the scheduler and executor's process
        self.remote = config.engine_process and self.task == "generate"  # an embedding model stays here
        self._fingerprint: str | None = None

    # -- life cycle ---------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every actor; report ready once the model is loaded and warm; run until cancelled.
        An engine process that dies is started again (at most RESTARTS times an hour)."""
        started, restarts = False, list[float]()
        while True:
            try:
                async with trio.open_nursery() as outer:
                    self._outer = outer  # holds stop()'s watchdog, which must outlive the actors' nursery
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        await self._start_actors(nursery)
                        if not started:
                            started = True
                            task_status.started(self)
                    outer.cancel_scope.cancel()  # every actor ended: the watchdog is not needed
                return
            except Exception as exc:
                if not started:
                    raise  # a model that cannot load or warm up must stop the server starting
                # An actor crashed (a bug, not a request's fault: those fail one request). The
                # actors are gone; this model answers 503 and /health says why, while the server
                # and its other models carry on. Every live request gets a clean error now.
                self._die(exc)
                restarts = [t for t in restarts if time.monotonic() - t < 3600] + [time.monotonic()]
                if not self.remote or self.stopping or len(restarts) > RESTARTS or self.config.api_servers > 1:  # others hold its sockets
                    return
                log.warning("engine_process_restarting", model=self.served_name, restarts=len(restarts))  # 503 until it is up

    async def _start_actors(self, nursery: trio.Nursery) -> None:
        """The engine's side first (the model's limits size everything else), then the others in order."""
        (tok_send, tok_recv), (out_send, out_recv) = trio.open_memory_channel[Any](self.config.max_pending), trio.open_memory_channel[Any](4)
        self._tokenizer_inbox = tok_send
        info = await (self._start_remote if self.remote else self._start_local)(nursery, out_send)
        self.detokenizer = DetokenizerActor(
            _fast_backend(self.tokenizer), self.eos_token_ids, out_recv, self._scheduler_inbox.clone(), self.served_name, on_done=self._forget
        )
        self.detokenizer.on_finish = self.on_finish
        guides = GuideCompiler(self.tokenizer, info.vocab_size) if self.task == "generate" else None
        self.tokenizer_actor = TokenizerActor(
            self.tokenizer, self.max_model_len, tok_recv, self._scheduler_inbox.clone(), guides, task=self.task, images=self.images
        )
        await nursery.start(self.detokenizer.run)
        await nursery.start(self.tokenizer_actor.run)
        self.accepting, self.dead_reason = True, None
        log.info("runtime_ready", model=self.served_name, impl=info.impl, device=info.device, dtype=info.dtype, kv_tokens=info.num_kv_blocks * info.block_size, max_model_len=self.max_model_len,
            reasoning=self.thinking.card() if self.thinking is not None else None, tool_format=self.tool_format, sampling_defaults=self.sampling_defaults.card(), step_ms={f"{rows}x1+{tokens}": round(seconds * 1e3, 1) for rows, tokens, seconds in info.step_samples})

    async def _start_local(self, nursery: trio.Nursery, out_send: trio.MemorySendChannel[Any]) -> ModelInfo:
        """The executor first (the model's limits size the scheduler), then the scheduler."""
        cfg = self.config
        plans_send, plans_recv = trio.open_memory_channel[Any](1)
        results_send, results_recv = trio.open_memory_channel[Any](1)
        # A request (with its siblings) a live one; an aborted one leaves admission's count before its request leaves
        # the channel, so clients that come and go in one long step can fill it: a 429 (SchedulerInbox.submit).
        sched_send, sched_recv = trio.open_memory_channel[Any](cfg.max_pending + 16)
        aborts_send, aborts_recv = trio.open_memory_channel[Any](SchedulerInbox.ABORTS_PER_REQUEST * cfg.max_pending + 16)  # room for every abort (can_admit)
        self._scheduler_inbox = SchedulerInbox(sched_send, aborts_send)
        self.executor = ExecutorActor(self.runner, plans_recv, results_send, num_threads=cfg.num_threads)
        self.executor.on_step = self.on_step
        info = self._fit(await nursery.start(self.executor.run))
        self.scheduler: SchedulerActor | EngineLink = SchedulerActor(self.make_core(info), sched_recv, plans_send, results_recv, out_send, aborts_recv, async_scheduling=cfg.async_scheduling)
        await nursery.start(self.scheduler.run)
        return info

    async def _start_remote(self, nursery: trio.Nursery, out_send: trio.MemorySendChannel[Any]) -> ModelInfo:  # actors/engine_link.py
        self.link = EngineLink(self.config, out_send, self.on_step)
        self.scheduler = self.link
        self._scheduler_inbox = self.link.inbox  # type: ignore[assignment]
        return self._fit(await nursery.start(self.link.run))

    def _fit(self, info: ModelInfo) -> ModelInfo:
        """The loaded model's limits: a request must fit in the KV cache on its own, or it could never be scheduled."""
        self.info, self.max_model_len = info, info.max_model_len
        if self.task == "generate":
            self.max_model_len = min(info.max_model_len, info.num_kv_blocks * info.block_size)
        return info

    def _die(self, exc: BaseException) -> None:
        self.accepting = False
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # trio wraps it: name the cause
            exc = exc.exceptions[0]
        self.dead_reason = f"{type(exc).__name__}: {exc}"
        log.error("runtime_crashed", model=self.served_name, error=self.dead_reason, exc_info=exc)
        for request_id in list(self.requests):
            ctx = self.requests.pop(request_id)
            ctx.aborted = True
            ctx.mailbox.fail(EngineDead(f"The engine for {self.served_name} stopped (request id {request_id}); the server log has the details."))

    def make_core(self, info: ModelInfo) -> SchedulerCore | EmbeddingSchedulerCore:
        return make_core(self.config, info, self.task, self.step_stretch, self.max_model_len, self.eos_token_ids)

    async def drain(self, timeout: float) -> int:
        """Stop admitting; wait up to `timeout` for live requests; abort the rest: how many."""
        self.accepting = False
        with trio.move_on_after(timeout):
            while self.requests:
                await trio.sleep(0.05)
        for request_id in (live := list(self.requests)):
            self.abort(request_id, AbortReason.SHUTDOWN)
        return len(live)

    def stop(self, deadline: float = 10.0) -> None:
        """Close the actors in pipeline order: the tokenizer's inbox closes (it ends), the
        scheduler finishes its step in flight and closes its channels, so the executor closes
        the runner and joins the device thread, and the detokenizer ends on end-of-channel.
        Whatever is still running after `deadline` seconds is cancelled."""
        self.accepting = False
        if self._nursery is None or self.dead_reason is not None or self.stopping:
            return
        self.stopping = True
        for request_id in list(self.requests):  # normally none: serve drains first
            self.abort(request_id, AbortReason.SHUTDOWN)
        self._tokenizer_inbox.close()
        if not self._scheduler_inbox.shutdown():
            self._nursery.cancel_scope.cancel()
            return
        self._outer.start_soon(self._cancel_after, deadline)

    async def _cancel_after(self, deadline: float) -> None:
        await trio.sleep(deadline)
        log.warning("stop_deadline_passed", model=self.served_name, deadline_s=deadline)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- requests -----------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """system_fingerprint: the runner's (weights, dtype, device, KV cache, torch) plus the
        engine's own configuration and version, so changing any of them changes it."""
        if self.info is None:
            return ""
        if self._fingerprint is None:
            cfg = self.config
            source = [
                self.info.fingerprint,
                _ENGINE_VERSION,
                self.max_model_len,
                cfg.max_num_seqs,
                cfg.max_num_batched_tokens,
                cfg.max_num_batched_tokens_embed,
                self.step_stretch,
                cfg.max_prompt_chunks,
                cfg.burst_tokens,
                cfg.spec_decoding,
            ]
            self._fingerprint = "fp_" + hashlib.sha256(repr(source).encode()).hexdigest()[:12]
        return self._fingerprint

    def health(self) -> tuple[bool, str | None]:
        """(ok, why not): the device thread is alive and no step overran its deadline."""
        if self.dead_reason is not None:
            return False, f"the engine failed: {self.dead_reason}"
        if not self.accepting:
            return False, "not accepting requests"
        if self.link is not None and not self.link.alive():
            return False, "the engine process is gone"
        if self.link is None and not self.executor.thread.is_alive:
            return False, "device thread is dead"
        age = (self.link.silent_for() if self.requests else 0.0) if self.link is not None else self.executor.step_age()
        if age > self.config.step_deadline:
            return False, f"a step has been running for {age:.1f}s"
        return True, None

    def open(self, prompt: Prompt, sampling: SamplingParams) -> RequestStream:
        """Admit a request; its deltas come from the returned stream, which must be closed.

        Its id is the one the API edge bound to the log context (so every actor's log lines
        and the HTTP access line share it), or a fresh one.

        Raises Overloaded when `max_pending` requests are live, or when `max_pending_tokens`
        is set and the estimated tokens of live requests plus this one's would pass it (a lone
        request is always admitted, so one larger than the budget is not refused forever);
        EngineDead when the runtime is not accepting.
        """
        return self.open_many(prompt, sampling, 1)[0]

    def open_many(
        self, prompt: Prompt, sampling: SamplingParams, n: int, group: GroupSignal | None = None
    ) -> list[RequestStream]:
        """`n` sequences from one prompt (n / best_of): tokenized once, prompt blocks shared.

        Their mailboxes share one GroupSignal, so a reader can wait on all of them together.
        Admission as in `open()`, counting all n.
        """
        if self.dead_reason is not None:
            then = "its process is starting again: retry shortly" if self.remote else "the server needs a restart"
            raise EngineDead(f"The engine for {self.served_name} failed ({self.dead_reason}); {then}.")
        if not self.accepting:
            raise EngineDead("The server is not accepting requests (starting up or shutting down).")
        if prompt.token_ids and self.info is not None and max(prompt.token_ids) >= self.info.vocab_size:
            # Found by the fuzz test: an id past the embedding table fails the whole device step,
            # and with it every other request batched into that step.
            raise InvalidRequest(f"Token ids must be below the vocabulary size, {self.info.vocab_size}.", param="prompt", code="invalid_token_id")
        if is_full(len(self.requests), self.config.max_pending, n):
            raise Overloaded(f"{len(self.requests)} requests are in flight; retry shortly.")
        if not self._scheduler_inbox.can_admit(len(self.requests), n):
            raise Overloaded("The scheduler's control queue is full of aborts waiting for the step in flight; retry shortly.")
        cost = 0
        if self._budget.budget is not None:
            cost = estimate_tokens(prompt, sampling, self.max_model_len, self.images.max_tokens_per_image if self.images is not None else 0)
            pending = self.pending_tokens()
            if self._budget.refuses(pending, n * cost):
                raise Overloaded(f"{pending} tokens are pending and this request may need {n * cost} more; retry shortly.")
        bound_id = structlog.contextvars.get_contextvars().get("request_id")
        now = time.perf_counter()
        if group is None and n > 1:
            group = GroupSignal()
        contexts = []
        for i in range(n):
            # The first sequence takes the id bound at the edge (logs and the access line then
            # agree); any other, or a clash (several prompts in one request), gets a fresh one.
            request_id = bound_id if i == 0 and isinstance(bound_id, str) else None
            if request_id is None or request_id in self.requests:
                request_id = f"{self._id_prefix}{next(self._ids):08x}"
            ctx = RequestContext(
                request_id=request_id, prompt=prompt, sampling=sampling, arrival_time=now, mailbox=DeltaMailbox(self.config.stream_interval)
            )
            ctx.mailbox.group = group
            contexts.append(ctx)
        first = contexts[0]
        first.siblings = contexts[1:]
        try:
            self._tokenizer_inbox.send_nowait(first)
        except trio.WouldBlock:
            raise Overloaded("The tokenizer queue is full; retry shortly.") from None
        for ctx in contexts:
            self.requests[ctx.request_id] = ctx
            if cost:
                self._budget.charge(ctx.request_id, cost)
        return [RequestStream(self, ctx) for ctx in contexts]

    async def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, encoded as requests are, by the tokenizer actor off the event loop."""
        return await self.tokenizer_actor.encode(prompt)

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids, decoded by the tokenizer actor off the event loop."""
        return await self.tokenizer_actor.decode(token_ids, skip_special_tokens)

    def pending_tokens(self) -> int:
        """Estimated tokens of live requests (0 unless max_pending_tokens is set)."""
        return self._budget.pending(self.requests.keys())

    def tokens_spent(self) -> bool:
        """Whether `max_pending_tokens` refuses every request now, whatever its size."""
        return self._budget.spent(self.requests.keys())

    @asynccontextmanager
    async def submit(self, prompt: Prompt, sampling: SamplingParams) -> AsyncIterator[RequestStream]:
        """`open()` as a context manager: leaving the block early aborts the request."""
        stream = self.open(prompt, sampling)
        try:
            yield stream
        finally:
            stream.close()

    def _forget(self, request_id: str, mailbox: DeltaMailbox) -> None:
        """The detokenizer finished or failed the request: it is no longer live. (Matched by
        mailbox too: an id the edge bound may have been reused once the first was aborted.)"""
        ctx = self.requests.get(request_id)
        if ctx is not None and ctx.mailbox is mailbox:
            del self.requests[request_id]

    def abort(self, request_id: str, reason: AbortReason) -> None:
        ctx = self.requests.pop(request_id, None)
        if ctx is None:
            return
        ctx.aborted = True
        ctx.mailbox.fail(EngineDead("The request was aborted: server shutting down.") if reason is AbortReason.SHUTDOWN else _Aborted())
        try:
            self._scheduler_inbox.abort(request_id, reason)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            log.error("abort_not_delivered", request_id=request_id)

    def statistics(self) -> dict[str, Any]:
        encoder = getattr(getattr(self.runner, "model", None), "encoder_cache", None)  # a vision model's encoder cache
        return {"live_requests": len(self.requests), **self.scheduler.statistics(), **(encoder.statistics() if encoder is not None else {})}


class _Aborted(Exception):
    pass


def _fast_backend(tokenizer: Any) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None:
        raise TypeError("Switchyard needs a fast (tokenizers-backed) tokenizer")
    return backend
