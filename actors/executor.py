"""The device executor actor: runs each plan on its device's dedicated OS thread.

Owns: the runner's life cycle (load, warm-up, close, all on one thread) and turning a runner
exception into a failed step (`StepResult.error`) instead of a dead actor. It also keeps the
step clock that health checks read. Imports trio and runtime; never torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import trio

from actors.runners.base import Runner
from runtime.logging import get_logger
from runtime.messages import StepPlan, StepResult
from runtime.protocol import ModelInfo
from runtime.thread_bridge import device_threads

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
        self.step_started: float | None = None  # perf_counter of the step in flight
        self.num_failed_steps = 0
        self.busy_seconds = 0.0
        self.on_step: list[Callable[[StepPlan, float, bool], None]] = []  # (plan, elapsed, failed), for metrics

    async def run(self, task_status: trio.TaskStatus[ModelInfo] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            info = await self.thread.run(self.runner.load)
            samples = await self.thread.run(self.runner.warmup)
            task_status.started(msgspec.structs.replace(info, step_samples=tuple(samples or ())))
            async with self.plans, self.results:
                async for plan in self.plans:
                    await self.results.send(await self._execute(plan))
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.thread.run(self.runner.close)
                finally:
                    await device_threads.release(self.device)

    async def _execute(self, plan: StepPlan) -> StepResult:
        self.step_started = started = time.perf_counter()
        failed = False
        try:
            return await self.thread.run(self.runner.execute, plan)
        except Exception as exc:
            failed = True
            self.num_failed_steps += 1
            log.exception("step_failed", step_id=plan.step_id, request_ids=[s.request_id for s in plan.seqs])
            return StepResult(step_id=plan.step_id, sampled={}, error=f"{type(exc).__name__}: {exc}")
        finally:
            elapsed = time.perf_counter() - started
            self.busy_seconds += elapsed
            self.step_started = None
            for hook in self.on_step:
                hook(plan, elapsed, failed)

    def step_age(self) -> float:
        """Seconds the step in flight has been running (0 when idle)."""
        return 0.0 if self.step_started is None else time.perf_counter() - self.step_started
