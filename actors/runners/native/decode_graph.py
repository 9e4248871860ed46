"""Compiled graphs for the native model's whole step of one sequence: one token, or a few.

Owns: `DecodeGraph`, the decode step of a single sequence (embedding, every layer with its
paged attention, final norm, lm_head) as one `torch.compile(fullgraph=True)` graph, and beside
it the same for one sequence fed a few tokens after its context (2 to MAX_FEW_TOKENS: a
speculative draft's verify step, or a short last prompt chunk); `applies()` and `applies_few()`
say which steps they run.

Why: at one row a step is ~6,000 small aten calls around 121 weight products, and those calls,
not the weights' bytes, were a third of its time (SmolLM2-135M int4 on this EPYC: 8.5 ms of a
~19 ms step in the int4 products). One graph fuses each layer's norm, rotary, cache write and
gather, softmax and SwiGLU into a few C++ kernels and runs the 30 layers without Python between
them. Interleaved against the eager step (1 thread, process CPU time): 1.32x with inductor's
Python wrapper, 1.06x more with its C++ wrapper (`cpp_wrapper`).

The attention is traced into the graph, not hidden in an opaque custom op: the op's Python
dispatch cost ~100 us a layer and left the graph 1.02x the eager step. The context length
reaches the graph only as the size of the gather's row index, marked dynamic, so a growing
context never recompiles; the cache write (`index_copy_` into the layer's cache, a graph input)
is done in place by inductor, not by copying the cache. Sequences of length 1 are left to the
eager step (torch would specialise the size 1 and compile again).

A verify step of one stream (its token and a draft of k) is that step again with k + 1 query
rows and a causal mask, and eager it cost as much over the one-row graph as the draft saved:
with the one-row step compiled, n-gram drafts at c=1 no longer paid. Its own graph, the token
count and the context both dynamic (one graph for every draft length), ran it 1.4-2.0x faster
than eager (SmolLM2 Q4_1, 2 threads, T = 2..5; /tmp prototype, see docs/performance.md's
speculative decoding section for the server figures), and is compiled after the one-row graph
on the same background thread.

This is all `--compile` compiles. Every other step (prompt chunks, two or more decode rows)
runs eager: compiling the layers' dense parts for them (a dynamic token dimension, four graphs)
lost to eager at every bf16 size measured and was mixed for int4 (interleaved step_ab, 2
threads, AMD EPYC: bf16 decode B=4 0.88x, B=16 0.93x, B=32 0.93x, prefill of 128 tokens 0.95x;
int4 B=4 0.81x, B=32 1.06x, prefill 1.09x), and through the server int4 + compile ran 0.86-0.92x
of int4 eager at c=4 and c=32 (ops/results/sweep-c1-c4-c32-quantized-llama-2026-11-24-epyc-zen4.json). Dropping those
graphs took ~20 s off a first start.

Owns also where inductor keeps its on-disk cache (`use_disk_cache`), so a restart loads the
graph instead of compiling it again.
"""

from __future__ import annotations

import os
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from actors.runners.native.attention import write_kv
from actors.runners.native.llama import rms_norm
from actors.runners.paged_attention import float32_decode
from runtime.logging import get_logger

log = get_logger("runner")

OPTIONS = {"cpp_wrapper": True}


def use_disk_cache() -> None:
    """Point inductor's caches at a directory that survives reboots (not /tmp), unless the user
    chose one. Importing torch._dynamo (transformers does) already wrote inductor's /tmp
    default into the variable, so that value counts as unset; call this before the process's
    first torch.compile."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path.home() / ".cache" / "switchyard" / "inductor")


def attend_one(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    write_rows: torch.Tensor, read_rows: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """One decode token: q [1, H, d], k/v [1, KVH, d] → [1, H, d]. k/v go to the cache rows
    `write_rows` first, then the sequence's context (`read_rows`, head-major) is attended in
    float32, as paged_attention's decode does for few sequences."""
    kv_heads, _, head_dim = k_cache.shape
    k_rows = k_cache.view(-1, head_dim)
    v_rows = v_cache.view(-1, head_dim)
    k_rows.index_copy_(0, write_rows, k[0])
    v_rows.index_copy_(0, write_rows, v[0])
    num_heads = q.shape[1]
    length = read_rows.shape[0] // kv_heads
    qg = q[0].view(kv_heads, 1, num_heads // kv_heads, head_dim)  # [KVH, 1, G, d]: heads grouped as repeat_kv does
    keys = k_rows.index_select(0, read_rows).view(kv_heads, 1, length, head_dim)
    values = v_rows.index_select(0, read_rows).view(kv_heads, 1, length, head_dim)
    # One sequence, so nothing is padded: no bias.
    return float32_decode(qg, keys, values, 0.0, scale).view(1, num_heads, head_dim)


def attend_few(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    write_rows: torch.Tensor, ctx_rows: torch.Tensor, mask: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """A few tokens of one sequence: q [T, H, d], k/v [T, KVH, d] → [T, H, d]. k/v go to the
    cache first, then the context (`ctx_rows`, head-major) is attended under `mask` [1, 1, T, L]
    (causal over the new tokens), as attention.py's prefill does for one chunk."""
    kv_heads, _, head_dim = k_cache.shape
    k_rows, v_rows = write_kv(k, v, k_cache, v_cache, write_rows)
    tokens = q.shape[0]
    length = ctx_rows.shape[0] // kv_heads
    keys = k_rows.index_select(0, ctx_rows).view(1, kv_heads, length, head_dim)
    values = v_rows.index_select(0, ctx_rows).view(1, kv_heads, length, head_dim)
    out = F.scaled_dot_product_attention(q.view(1, tokens, -1, head_dim).transpose(1, 2), keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(tokens, -1, head_dim)


def _own_code(fn: Any) -> types.FunctionType:
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _skip_weight_guards(entries: list[Any]) -> list[bool]:
    return [not entry.name.startswith("self.model.w.") for entry in entries]


def applies(input_ids: torch.Tensor, step: Any, keep: torch.Tensor) -> bool:
    """A step this graph runs: one decode token of a context of 2 or more, nothing else."""
    paged = step.paged
    return (
        input_ids.shape[0] == 1
        and keep.shape[0] == 1
        and not step.prefills
        and paged.decode_rows is not None
        and not paged.per_sequence_decode
        and paged.decode_len >= 2
    )


MAX_FEW_TOKENS = 8  # a draft of up to 7 tokens and the token before it


def applies_few(input_ids: torch.Tensor, step: Any) -> bool:
    """A step the few-token graph runs: one sequence fed 2..MAX_FEW_TOKENS tokens after a
    context in the cache, nothing else."""
    if len(step.prefills) != 1 or step.paged.decode_idx is not None:
        return False
    batch = step.prefills[0]
    return batch.num_chunks == 1 and batch.ctx_rows is not None and 2 <= input_ids.shape[0] <= MAX_FEW_TOKENS


class DecodeGraph:
    """The native model's one-row decode step, compiled whole on a background thread."""

    def __init__(self, model: Any) -> None:
        self.model = model
        # Guards: dynamo would check every weight tensor's and holder's type, shape and strides
        # before each step (~900 guards, ~0.9 ms of a 12 ms step). The weights never change
        # after load, so their guards are dropped (1.07x the step, interleaved), and this graph
        # gets a code object of its own: dynamo keeps graphs per code object, so with the weight
        # guards gone a second model in the process must never find this one's graph.
        step = types.MethodType(_own_code(DecodeGraph._step), self)
        self.compiled = torch.compile(step, fullgraph=True, options={**OPTIONS, "guard_filter_fn": _skip_weight_guards})
        few = types.MethodType(_own_code(DecodeGraph._few), self)
        self.compiled_few = torch.compile(few, fullgraph=True, options={**OPTIONS, "guard_filter_fn": _skip_weight_guards})
        self._ready = threading.Event()
        self._few_ready = threading.Event()
        self.compile_nice: int | None = None  # the compiling thread's niceness once it started (None off Linux)
        self._thread: threading.Thread | None = None

    def _whole_step(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        """Embedding, every layer (its attention `attend(layer index, q, k, v)`), final norm, lm_head."""
        model = self.model
        h = torch.nn.functional.embedding(input_ids, model.w.embed)
        cos = model.cos[positions][:, None, :]
        sin = model.sin[positions][:, None, :]
        for i, layer in enumerate(model.w.layers):
            q, k, v = model.pre_attention(h, layer, cos, sin)
            h = model.post_attention(h, attend(i, q, k, v), layer)
        h = rms_norm(h, model.w.final_norm, model.cfg.rms_norm_eps)
        return model.linear(h, model.w.lm_head, None)

    def _step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, write_rows: torch.Tensor, read_rows: torch.Tensor,
        k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        scale = self.model.scale
        return self._whole_step(input_ids, positions, lambda i, q, k, v: attend_one(q, k, v, k_cache[i], v_cache[i], write_rows, read_rows, scale))

    def _few(
        self, input_ids: torch.Tensor, positions: torch.Tensor, write_rows: torch.Tensor, ctx_rows: torch.Tensor, mask: torch.Tensor,
        k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        scale = self.model.scale
        return self._whole_step(input_ids, positions, lambda i, q, k, v: attend_few(q, k, v, k_cache[i], v_cache[i], write_rows, ctx_rows, mask, scale))

    def few(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Any, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> torch.Tensor:
        """Logits `[T, V]` of every fed token of a step `applies_few` accepts (once `few_ready`)."""
        batch = step.prefills[0]
        for tensor, dims in ((input_ids, (0,)), (positions, (0,)), (step.paged.write_rows, (0,)), (batch.ctx_rows, (0,)), (batch.mask, (2, 3))):
            for dim in dims:  # one graph for every token count and context length
                torch._dynamo.mark_dynamic(tensor, dim)
        return self.compiled_few(input_ids, positions, step.paged.write_rows, batch.ctx_rows, batch.mask, k_cache, v_cache)

    @property
    def few_ready(self) -> bool:
        return self._few_ready.is_set()

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Any, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> torch.Tensor:
        """Logits `[1, V]` of the step's one token (once `ready`; until then the eager step runs)."""
        read_rows = step.paged.decode_rows
        torch._dynamo.mark_dynamic(read_rows, 0)
        return self.compiled(input_ids, positions, step.paged.write_rows, read_rows, k_cache, v_cache)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def wait_few_ready(self, timeout: float | None = None) -> bool:
        return self._few_ready.wait(timeout)

    def compile_in_background(
        self, scratch_step: Callable[[list[tuple[int, int]]], tuple[Any, torch.Tensor]], k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
    ) -> None:
        """Compile on a thread of its own while the eager step serves, then swap each graph in
        (the one-row graph first, then the few-token one).

        `scratch_step(seqs)` builds a step in a KV block no request ever holds (the runner keeps
        one past the blocks it reports), so the compiling calls may write the live caches while
        the device thread runs steps in other rows. The first start pays minutes of inductor
        (on disk after); nothing waits for it.
        """
        if self._thread is not None:  # started already
            return
        device = k_cache[0].device

        def one_row() -> None:
            step, positions = scratch_step([(1, 1)])
            self(torch.ones(1, dtype=torch.long, device=device), positions, step, k_cache, v_cache)

        def few_tokens() -> None:
            # A quantized linear switches kernels past `max_rows` rows (quant.QuantLinear): a
            # graph for each side, so no draft length compiles on the device thread.
            max_rows = getattr(self.model.linear, "max_rows", MAX_FEW_TOKENS)
            for tokens in sorted({2, min(max_rows + 1, MAX_FEW_TOKENS)}):
                step, positions = scratch_step([(1, tokens)])
                self.few(torch.ones(tokens, dtype=torch.long, device=device), positions, step, k_cache, v_cache)

        def lowest_priority() -> None:
            # The compile takes minutes of a core on every start on a CPU (2.5 min for the
            # one-row graph and 4+ for the few-token one with the inductor cache warm, 2-core
            # Xeon, 2026-11-26), while the eager step serves: at the default priority it took
            # that core from the step's threads and the event loop. At nice 19 it runs on idle
            # cycles only; Linux sets a thread's niceness by its id, and what the thread forks
            # (inductor's compiler processes) inherits it.
            try:
                thread_id = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, thread_id, 19)
                self.compile_nice = os.getpriority(os.PRIO_PROCESS, thread_id)
            except (AttributeError, OSError) as exc:  # not Linux, or not allowed: compile at the default priority
                log.info("compile_priority_unchanged", error=repr(exc)[:200])

        def compile_all() -> None:
            lowest_priority()
            for part, run, ready in (("decode graph (one row, whole step)", one_row, self._ready), ("few-token graph (one row, a draft's verify step)", few_tokens, self._few_ready)):
                started = time.perf_counter()
                log.info("compiling", part=part, background=True)
                try:
                    with torch.inference_mode():  # the device thread's mode: its tensors pass the graph's guards
                        run()
                except Exception as exc:  # the eager step goes on serving; say why the graph never came
                    log.error("compile_failed", part=part, error=repr(exc)[:500])
                    return
                ready.set()
                seconds = round(time.perf_counter() - started, 1)
                log.info("compiled", part=part, seconds=seconds, swapped_in=True, cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))

        self._thread = threading.Thread(target=compile_all, name="switchyard-compile", daemon=True)
        self._thread.start()
