"""The device executor actor: runs each plan on its device's dedicated OS thread.

Owns: the runner's life cycle (load, warm-up, close, all on one thread) and turning a runner
exception into a failed step (`StepResult.error`) instead of a dead actor. It also keeps the
step clock that health checks read. Imports trio and runtime; never torch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import msgspec
import trio

from actors.runners.base import Runner
from runtime.logging import get_logger
from runtime.messages import StepPlan, StepResult
from runtime.protocol import ModelInfo
from runtime.thread_bridge import Job, device_threads

log = get_logger("executor")


class ExecutorActor:
    def __init__(
        self,
        runner: Runner,
        plans: trio.MemoryReceiveChannel[StepPlan],
        results: trio.MemorySendChannel[StepResult],
        num_threads: int | None = None,
    ) -> None:
        self.runner = runner
        self.plans = plans
        self.results = results
        self.device = runner.device_key
        # Shared with every other model on this device (runtime/thread_bridge.py says why).
        self.thread = device_threads.acquire(self.device, num_threads)
        # perf_counter of each step handed to the device thread and not finished, oldest first
        # (two when the scheduler planned one ahead: the device runs them in order).
        self._queued: deque[float] = deque()
        self._last_finished = 0.0
        self.num_failed_steps = 0
        self.busy_seconds = 0.0
        self.on_step: list[Callable[[StepPlan, float, bool], None]] = []  # (plan, elapsed, failed), for metrics

    async def run(self, task_status: trio.TaskStatus[ModelInfo] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            info = await self.thread.run(self.runner.load)
            samples = await self.thread.run(self.runner.warmup)
            task_status.started(msgspec.structs.replace(info, step_samples=tuple(samples or ())))
            async with self.plans, self.results, trio.open_nursery() as steps:
                # Each plan goes to the device thread as soon as it arrives, behind the one
                # running; results go back in plan order.
                previous: trio.Event | None = None
                async for plan in self.plans:
                    sent = trio.Event()
                    self._queued.append(time.perf_counter())
                    steps.start_soon(self._step, plan, self.thread.submit(self.runner.execute, plan), previous, sent)
                    previous = sent
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.thread.run(self.runner.close)
                finally:
                    await device_threads.release(self.device)

    async def _step(self, plan: StepPlan, job: Job[StepResult], previous: trio.Event | None, sent: trio.Event) -> None:
        result = await self._outcome(plan, job)
        if previous is not None:
            await previous.wait()
        await self.results.send(result)
        sent.set()

    async def _outcome(self, plan: StepPlan, job: Job[StepResult]) -> StepResult:
        """The step's result; a runner exception becomes a failed step, not a dead actor."""
        failed = False
        try:
            return await job.result()
        except Exception as exc:
            failed = True
            self.num_failed_steps += 1
            log.exception("step_failed", step_id=plan.step_id, request_ids=[s.request_id for s in plan.seqs])
            return StepResult(step_id=plan.step_id, sampled={}, error=f"{type(exc).__name__}: {exc}")
        finally:
            now = time.perf_counter()
            elapsed = now - max(self._queued.popleft(), self._last_finished)  # from when the device took it up
            self._last_finished = now
            self.busy_seconds += elapsed
            for hook in self.on_step:
                hook(plan, elapsed, failed)

    def step_age(self) -> float:
        """Seconds the step running on the device has been running (0 when idle)."""
        if not self._queued:
            return 0.0
        return time.perf_counter() - max(self._queued[0], self._last_finished)
