"""A torch-free `Runner` with scripted tokens, latency and failures, and a Runtime built on it.

`FakeRunner` follows the Runner protocol (actors/runners/base.py) on the executor's real
dedicated thread: deterministic tokens, an optional sleep per step, and failure injection
(`fail_if(plan)` raising inside `execute`, like a device error). `fake_runtime()` wires it to
the tiny test tokenizer so the real tokenizer, scheduler and detokenizer actors run around it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.runners.request_state import RequestStates
from runtime.config import RuntimeConfig
from runtime.messages import StepPlan, StepResult
from runtime.protocol import ModelInfo


class CountingMatcher:
    """A grammar matcher that accepts every token and remembers them (runner-state tests)."""

    def __init__(self) -> None:
        self.consumed: list[int] = []

    def consume_token(self, token: int) -> bool:
        self.consumed.append(token)
        return True

    def rollback(self, n: int) -> bool:
        del self.consumed[len(self.consumed) - n :]
        return True


class InjectedFailure(RuntimeError):
    pass


class FakeRunner:
    def __init__(
        self,
        *,
        vocab_size: int,
        first_token: int = 3,  # ids below this (special tokens) are never produced
        max_model_len: int = 256,
        num_kv_blocks: int = 128,
        block_size: int = 4,
        step_delay: float = 0.0,
        fail_if: Callable[[StepPlan], bool] | None = None,
    ) -> None:
        self.device_key = "cpu"  # shares the device thread with real runners on the CPU
        self.vocab_size = vocab_size
        self.first_token = first_token
        self.max_model_len = max_model_len
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.step_delay = step_delay
        self.fail_if = fail_if
        self.num_steps = 0
        self.num_failed = 0
        self.thread_ids: set[int] = set()
        self.closed = False
        self.release = threading.Event()  # for tests that hold a step: set() lets it go
        self.release.set()
        self.requests = RequestStates()  # what the runner keeps of each request, as the torch runner does

    def load(self) -> ModelInfo:
        self.thread_ids.add(threading.get_ident())
        return ModelInfo(
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            device="cpu",
            dtype="fake",
            num_kv_blocks=self.num_kv_blocks,
            block_size=self.block_size,
            fingerprint="fake",
        )

    def warmup(self) -> None:
        self.thread_ids.add(threading.get_ident())

    def execute(self, plan: StepPlan) -> StepResult:
        self.thread_ids.add(threading.get_ident())
        self.num_steps += 1
        if self.step_delay:
            time.sleep(self.step_delay)
        self.release.wait(timeout=30)
        if self.fail_if is not None and self.fail_if(plan):
            self.num_failed += 1
            raise InjectedFailure(f"injected device failure in step {plan.step_id}")
        self.requests.apply(plan)
        sampled, accepted = {}, {}
        for seq in plan.seqs:
            # Every row's, as the torch runner reads them: a pending token (async scheduling) from
            # the history; tokens the core wrote itself (a forced end of thinking) join it.
            fed = self.requests.input_ids(seq)
            if seq.sample:
                base = len(fed) - seq.num_draft_tokens  # a draft (speculative decoding) is verified
                state = self.requests.align(seq.request_id, seq.start_pos + base)
                token, kept = self.next_token(fed[:base], seq.start_pos), 0
                while kept < seq.num_draft_tokens and token == fed[base + kept]:  # as the torch runner keeps a draft
                    state.history.append(token)
                    kept += 1
                    token = self.next_token([token], seq.start_pos + base + kept - 1)
                sampled[seq.request_id] = token
                state.history.append(token)
                if seq.num_draft_tokens:
                    accepted[seq.request_id] = kept
        return StepResult(step_id=plan.step_id, sampled=sampled, accepted=accepted)

    def next_token(self, token_ids: list[int], start_pos: int) -> int:
        span = self.vocab_size - self.first_token
        return self.first_token + (token_ids[-1] * 31 + start_pos + len(token_ids)) % span

    def close(self) -> None:
        self.closed = True


def fake_runtime(model_dir: Path, config: RuntimeConfig | None = None, **runner_args: Any):  # type: ignore[no-untyped-def]
    """A Runtime on FakeRunner with the tiny model's tokenizer (tests/support/tiny_model.py)."""
    from transformers import AutoTokenizer

    from actors.engine import Engine

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    runner = FakeRunner(vocab_size=len(tokenizer), **runner_args)
    eos = frozenset([tokenizer.eos_token_id])
    return Engine(config or RuntimeConfig(served_name="fake", port=0), runner, tokenizer, "fake", eos)
