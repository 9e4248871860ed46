"""The contract between the executor actor and whatever computes a step.

Owns: the `Runner` protocol and `ModelInfo`. A runner is driven from exactly one OS thread
(the executor's dedicated thread): `load()`, then `warmup()`, then `execute(plan)` per step.
Imports runtime only; no torch here, so the fake runner and the tests stay torch-free.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from runtime.messages import StepPlan, StepResult


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    max_model_len: int
    vocab_size: int
    device: str
    dtype: str
    num_kv_blocks: int
    block_size: int
    embedding_size: int | None = None  # an embedder's vector length (the API checks `dimensions` by it)
    # A digest of everything that changes outputs (weights path, dtype, engine knobs); the API
    # reports it as system_fingerprint.
    fingerprint: str = ""
    # Which model path runs the steps: "native" (our Llama-family decoder) or "transformers"
    # (transformers' modules with our paged attention); "" for runners without the choice.
    impl: str = ""
    # Timed start-up steps, (decode rows, prompt tokens, seconds), that seed the scheduler's
    # step cost model (actors/runners/calibration.py); filled in by the executor after warm-up.
    step_samples: tuple[tuple[int, int, float], ...] = ()


class Runner(Protocol):
    # The device it runs on, resolved ("auto" -> "cpu" or "cuda:0"): the key of the device
    # thread it shares with the other models there (runtime/thread_bridge.py).
    device_key: str

    def load(self) -> ModelInfo: ...

    def warmup(self) -> list[tuple[int, int, float]] | None:
        """Warm up; may return timed steps for the scheduler's cost model (ModelInfo.step_samples)."""

    def execute(self, plan: StepPlan) -> StepResult: ...

    def close(self) -> None: ...
