"""What the layers above the actors see of one served model's engine: the `Runtime` protocol.

Owns: `Runtime` (the requests' door, the tokenizer's services, life cycle, health and
counters) and `ModelInfo` (what a runner reports once loaded). The HTTP edge (`api/http`)
knows an engine only through this protocol; `actors/engine.py` `Engine` implements it, and
the process layer (`api/process`, `api/cluster`) builds one (`actors/build.py`), so the edge
never imports an actor. Pure: msgspec, trio types and runtime only.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import msgspec
import trio

from runtime.config import RuntimeConfig
from runtime.generation_defaults import SamplingDefaults
from runtime.mailbox import GroupSignal
from runtime.messages import AbortReason
from runtime.reasoning import ThinkingFormat
from runtime.request import Prompt, RequestContext
from runtime.sampling import SamplingParams
from runtime.stream import RequestStream


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A loaded model's limits and identity, as its runner reports them."""

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
    # The most prompt chunks a step should carry beside streaming decodes for this runner's
    # fastest steps (None: any): 1 where steps of one chunk run a compiled graph and steps of
    # two run eager (actors/runners/native/path.py).
    prompt_chunks: int | None = None
    # Every step's rows computed row by row (actors/runners/native/rowwise.py): a position's
    # logits never depend on the step it rides in, so drafting and chunking change no answer.
    rowwise: bool = False


class Runtime(Protocol):
    """One served model's engine, as the HTTP edge, the registry and the metrics use it."""

    config: RuntimeConfig
    served_name: str
    task: str  # "generate" or "embed": which routes may send it requests
    tokenizer: Any  # the model's Hugging Face tokenizer (chat templates, logprob token text)
    eos_token_ids: frozenset[int]
    thinking: ThinkingFormat | None  # a reasoning model's thinking format (runtime/reasoning.py); None: it does not think
    tool_format: str  # the format its tool calls are written in (runtime/tool_formats.py); "" for an embedder
    sampling_defaults: SamplingDefaults  # for fields a request omits (runtime/generation_defaults.py)
    info: ModelInfo | None  # None until the runner has loaded
    max_model_len: int
    created: int  # Unix time the engine was made (the models list's `created`)
    max_images_per_prompt: int  # images a prompt may carry; 0: the model reads text only
    requests: dict[str, RequestContext]  # live requests, by id (the engine's own; read only)
    # Hooks: on_finish(ctx, finish_reason, now) once per finished request; on_step(plan,
    # elapsed, failed) once per step. Synchronous and cheap: they run on the event loop.
    on_finish: list[Callable[..., None]]
    on_step: list[Callable[..., None]]

    @property
    def fingerprint(self) -> str: ...

    async def run(self, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None: ...

    async def drain(self, timeout: float) -> int: ...

    def stop(self, deadline: float = 10.0) -> None: ...

    def health(self) -> tuple[bool, str | None]: ...

    def open(self, prompt: Prompt, sampling: SamplingParams) -> RequestStream: ...

    def open_many(self, prompt: Prompt, sampling: SamplingParams, n: int, group: GroupSignal | None = None) -> list[RequestStream]: ...

    def submit(self, prompt: Prompt, sampling: SamplingParams) -> AbstractAsyncContextManager[RequestStream]: ...

    def abort(self, request_id: str, reason: AbortReason) -> None: ...

    async def load_adapter(self, name: str, path: str) -> None: ...  # LoRA at run time (actors/lora_control.py)

    async def unload_adapter(self, name: str) -> None: ...

    async def encode(self, prompt: Prompt) -> list[int]: ...

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def pending_tokens(self) -> int: ...

    def tokens_spent(self) -> bool: ...

    def statistics(self) -> dict[str, Any]: ...
