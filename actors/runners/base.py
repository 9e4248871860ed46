"""The contract between the executor actor and whatever computes a step.

Owns: the `Runner` protocol; a loaded runner reports `runtime.protocol.ModelInfo`. A runner is
driven from exactly one OS thread (the executor's dedicated thread): `load()`, then `warmup()`,
then `execute(plan)` per step.
Imports runtime only; no torch here, so the fake runner and the tests stay torch-free.
"""

from __future__ import annotations

from typing import Protocol

from runtime.messages import StepPlan, StepResult
from runtime.protocol import ModelInfo


class Runner(Protocol):
    # The device it runs on, resolved ("auto" -> "cpu" or "cuda:0"): the key of the device
    # thread it shares with the other models there (runtime/thread_bridge.py).
    device_key: str

    def load(self) -> ModelInfo: ...

    def warmup(self) -> list[tuple[int, int, float]] | None:
        """Warm up; may return timed steps for the scheduler's cost model (ModelInfo.step_samples)."""

    def execute(self, plan: StepPlan) -> StepResult: ...

    def close(self) -> None: ...
