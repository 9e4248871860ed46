"""`make_core`: the scheduler's pure core for one served model, from its config and its runner's limits.

Owns the mapping from `RuntimeConfig` and the loaded model's `ModelInfo` to `SchedulerConfig`
(blocks, budgets, step stretch, drafting, adapters), in one place for the engine in the server's
process and the engine process (actors/engine_process.py).
"""

from __future__ import annotations

from actors.drafting import AUTO_MAX_ROWS
from actors.embed_core import EmbeddingSchedulerCore
from actors.sched_core import SchedulerConfig, SchedulerCore
from runtime.config import RuntimeConfig
from runtime.protocol import ModelInfo


def make_core(
    cfg: RuntimeConfig, info: ModelInfo, task: str, step_stretch: float | None, max_model_len: int, eos_token_ids: frozenset[int]
) -> SchedulerCore | EmbeddingSchedulerCore:
    if task == "embed":
        return EmbeddingSchedulerCore(cfg.max_num_batched_tokens_embed, cfg.max_num_seqs)
    fixed_blocks = bool(cfg.batch_invariant) and not info.rowwise
    drafter = cfg.drafter(info.rowwise)
    return SchedulerCore(
        SchedulerConfig(
            num_blocks=info.num_kv_blocks,
            block_size=info.block_size,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            # Fixed-block invariance (--batch-invariant off the row-invariant kernels): the token budget alone, no
            # bursts. There a chunk boundary changes a prompt's rounding; a time allowance or a burst's moves it.
            step_stretch=None if fixed_blocks else step_stretch,
            max_prompt_chunks=cfg.max_prompt_chunks or info.prompt_chunks,
            burst_tokens=0 if fixed_blocks else cfg.burst_tokens,
            step_samples=info.step_samples,
            max_model_len=max_model_len,
            eos_token_ids=eos_token_ids,
            num_spec_tokens=cfg.num_spec_tokens if drafter != "off" else 0,
            draft_model=drafter == "draft",
            spec_max_rows=AUTO_MAX_ROWS if cfg.spec_decoding == "auto" else None,
            max_adapters=cfg.max_loras if cfg.enable_lora else 0,
        )
    )
