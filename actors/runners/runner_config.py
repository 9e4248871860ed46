"""`RunnerConfig`: every setting of a generation runner, one frozen value passed whole.

Owns: what a `TorchRunner` is asked for (device, dtype, the KV cache's size, the model path and
its quantization, graphs and compile, the batch limits, a draft model, LoRA adapters) and how a
server's `RuntimeConfig` maps onto it (`of`). The runner hands it whole to what it builds (the
model path, its graphs, the draft model), so a setting is added in one place and read where it
applies, never threaded through constructors. Plain data, no torch: the device and dtype are
names here, resolved by the runner at load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from runtime.adapters import LoraSettings
from runtime.config import RuntimeConfig


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    device: str | None = None  # "auto"/None: CUDA when torch sees it, else the CPU
    dtype: str | None = None  # "auto"/None: bf16 on CUDA, on a CPU where it runs bf16 natively
    num_kv_blocks: int | None = None  # the KV cache: this many blocks, or `kv_cache_gib`, or
    kv_cache_gib: float | None = None  # sized from memory (kv_alloc.py): `memory_utilization`
    memory_utilization: float | None = None  # of what the process may use, shared by
    memory_parts: int = 1  # this many models (or replicas) in it
    block_size: int = 16
    num_threads: int | None = None
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    batch_invariant: bool | None = None  # None: where the row-invariant kernels apply
    model_impl: str = "auto"  # auto, native, transformers (model_paths.choose)
    compile: bool | None = False  # None: on a CPU's native path
    quantization: str | None = None  # None: the checkpoint's own quantized blocks where it ships them
    cuda_graphs: bool | None = None  # None: on when the model runs on CUDA
    max_num_seqs: int = 256
    max_step_tokens: int = 512
    draft_model: Path | None = None  # --spec-decoding draft's model
    lora: LoraSettings | None = None  # --enable-lora's adapters and slots

    @classmethod
    def of(cls, config: RuntimeConfig, draft_model: Path | None, lora: LoraSettings | None) -> RunnerConfig:
        """A server's runner: its model's settings (the draft model and adapters resolved)."""
        same = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if f.name not in ("max_step_tokens", "draft_model", "lora")}
        return cls(**same, max_step_tokens=config.max_num_batched_tokens, draft_model=draft_model, lora=lora)

    @property
    def dtype_explicit(self) -> bool:
        """Whether a dtype was asked for (which serves a checkpoint's shipped blocks dense)."""
        return self.dtype not in (None, "auto")
