"""torch.compile for the native model's dense layer parts, compiled once at start-up.

Owns: wrapping `LlamaModel.pre_attention` / `post_attention` in `torch.compile`, the warm-up
that compiles them before the first request (with progress in the log), and where inductor
keeps its on-disk cache (~/.cache/switchyard/inductor unless TORCHINDUCTOR_CACHE_DIR is set),
so a restart loads the kernels instead of compiling them again.

What is compiled and why: the norm → qkv → q/k-norm → rotary part and the o_proj → residual →
norm → gate/up → SwiGLU → down → residual part of a layer. These are the same two graphs in
every layer (the weights are inputs), so two graphs serve the whole model. The paged attention
between them stays eager: its gather length changes every step, and a compiled step that wrote
into the cache in place risked inductor copying whole cache tensors (seen in the issue's
measurements). The token dimension is dynamic (`dynamic=True`), so one graph serves every
batch size and prefill length without padding to buckets; torch specialises size 1, so a
decode step of one sequence gets its own graph. Four graphs in all, compiled by `warm_up`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from runtime.logging import get_logger

log = get_logger("runner")

# Token counts that force every graph the step can need: 1 (torch specialises size 1) and a
# general size (any other count reuses that dynamic graph).
WARM_TOKENS = (1, 3)


def use_disk_cache() -> str:
    """Point inductor's caches at a directory that survives reboots (not /tmp), unless the user
    chose one. Importing torch._dynamo (transformers does) already wrote inductor's /tmp
    default into the variable, so that value counts as unset; call this before the process's
    first torch.compile."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path.home() / ".cache" / "switchyard" / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def compile_model(model: Any) -> None:
    model.pre_attention = torch.compile(model.pre_attention, dynamic=True, fullgraph=True)
    model.post_attention = torch.compile(model.post_attention, dynamic=True, fullgraph=True)


def warm_up(model: Any) -> float:
    """Run each compiled part at every warm token count; returns the seconds it took."""
    cfg = model.cfg
    layer = model.w.layers[0]
    dtype, device = model.w.embed.dtype, model.w.embed.device
    started = time.perf_counter()
    total = 2 * len(WARM_TOKENS)
    done = 0
    with torch.inference_mode():
        for tokens in WARM_TOKENS:
            h = torch.zeros(tokens, cfg.hidden_size, dtype=dtype, device=device)
            cos = model.cos[:tokens][:, None, :]
            sin = model.sin[:tokens][:, None, :]
            q, _, _ = model.pre_attention(h, layer, cos, sin)
            done += 1
            log.info("compiling", graph=f"{done}/{total}", tokens=tokens, part="pre_attention", elapsed_s=round(time.perf_counter() - started, 1))
            model.post_attention(h, q, layer)
            done += 1
            log.info("compiling", graph=f"{done}/{total}", tokens=tokens, part="post_attention", elapsed_s=round(time.perf_counter() - started, 1))
    return time.perf_counter() - started
