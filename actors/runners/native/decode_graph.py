"""Compiled graphs of the native model's whole step: one decode row, several, several beside
one prompt chunk, or one sequence fed a few tokens.

Owns: `DecodeGraph`, each such step (the family's one forward, `Model.step`, with the
attention of graph_steps.py) as one `torch.compile(fullgraph=True)` graph, compiled on a background thread
while the eager step serves and swapped in when ready; and where inductor keeps its on-disk
cache (`use_disk_cache`), so a restart loads the graphs instead of compiling them again. What
each graph computes and which steps it takes: graph_steps.py.

Why: a step is thousands of small aten calls around the weight products, and those calls, not
the weights' bytes, were a third of its time; one graph fuses each layer's small ops into a few
C++ kernels and runs the layers without Python between them (the comments below give the
figures and their results files). The attention is traced into the graph and the counts and
context length reach it as dynamic sizes, so a growing context never recompiles; where the
model's code branches on a count, the counts are cut into width classes, one graph each, each
compiled before a step of its class runs it: a step never compiles on the device thread.
Steps with two or more prompt chunks, and the rest, run eager.
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

from actors.runners.native.graph_steps import (
    MAX_FEW_TOKENS,
    MIXED_MIN_ROWS,
    SCRATCH_TOKENS,
    attend_few,
    attend_mixed,
    attend_one,
    attend_rows,
    cuts,
    mixed_classes,
    width_classes,
)
from runtime.logging import get_logger
from runtime.memory import refreeze_heap

log = get_logger("runner")

# At one row a step is ~6,000 small aten calls around 121 weight products, and those calls, not
# the weights' bytes, were a third of its time (SmolLM2-135M int4 on an EPYC: 8.5 ms of a ~19 ms
# step in the int4 products). One graph fuses each layer's norm, rotary, cache write and gather,
# softmax and SwiGLU into a few C++ kernels and runs the 30 layers without Python between them.
# Interleaved against the eager step (1 thread, process CPU time): 1.32x with inductor's Python
# wrapper, 1.06x more with its C++ wrapper (`cpp_wrapper`).
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


def _own_code(fn: Any) -> types.FunctionType:
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _skip_weight_guards(entries: list[Any]) -> list[bool]:
    return [not entry.name.startswith("self.model.w.") for entry in entries]


class DecodeGraph:
    """The native model's decode steps (one row; 2 or more rows, by width class; 5 or more beside
    one prompt chunk, by token class) and a sequence's few-token step, each compiled whole on a
    background thread."""

    def __init__(self, model: Any, max_rows: int, max_tokens: int) -> None:
        self.model = model
        # Guards: dynamo would check every weight tensor's and holder's type, shape and strides
        # before each step (~900 guards, ~0.9 ms of a 12 ms step). The weights never change
        # after load, so their guards are dropped (1.07x the step, interleaved), and this graph
        # gets a code object of its own: dynamo keeps graphs per code object, so with the weight
        # guards gone a second model in the process must never find this one's graph.
        self.compiled = self._compiled(DecodeGraph._step)
        self.compiled_few = self._compiled(DecodeGraph._few)
        # The model's code branches on the row and token counts (the quantized linear's kernel:
        # `QuantLinear`'s `max_rows` and `dense_rows`; the attention's float32 path up to
        # FLOAT32_DECODE_MAX_SEQS rows), and dynamo guards each branch, so the counts are cut
        # into width classes. A graph per width class, each with a code object of its own
        # (dynamo keeps a code object's graphs in one cache, and another thread compiling into
        # the cache the device thread reads is what these never share).
        self.classes = [(lo, hi) for lo, hi in width_classes(model.linear, max_rows) if lo <= hi]  # none where a step holds one row
        self.compiled_rows = [self._compiled(DecodeGraph._rows) for _ in self.classes]
        self._rows_ready = [threading.Event() for _ in self.classes]
        fits = max_rows >= MIXED_MIN_ROWS  # a step may hold that many decode rows
        self.mixed = [c for c in mixed_classes(model.linear, max_tokens) if fits and c[0] - MIXED_MIN_ROWS + 1 <= SCRATCH_TOKENS]
        # The lm_head's linear branches on the kept rows too: a mixed graph takes only steps that
        # keep (sample) no more rows than the narrowest such class holds.
        self.mixed_keep = cuts(model.linear, MIXED_MIN_ROWS, max(max_rows, MIXED_MIN_ROWS) + 1, attention=False)[0]
        self.compiled_mixed = [self._compiled(DecodeGraph._mixed) for _ in self.mixed]
        self._mixed_ready = [threading.Event() for _ in self.mixed]
        self._ready = threading.Event()
        self._few_ready = threading.Event()
        self.compile_nice: int | None = None  # the compiling thread's niceness once it started (None off Linux)
        self._thread: threading.Thread | None = None

    def _compiled(self, method: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """`method` bound to this graph, with a code object of its own, compiled whole."""
        return torch.compile(types.MethodType(_own_code(method), self), fullgraph=True, options={**OPTIONS, "guard_filter_fn": _skip_weight_guards})

    # The one-row graph. The attention is traced into the graph, not hidden in an opaque custom
    # op: the op's Python dispatch cost ~100 us a layer and left the graph 1.02x the eager step.
    # The context length reaches the graph only as the size of the gather's row index, marked
    # dynamic, so a growing context never recompiles; the cache write (`index_copy_` into the
    # layer's cache, a graph input) is done in place by inductor, not by copying the cache.
    # Sequences of length 1 are left to the eager step (torch would specialise the size 1 and
    # compile again).
    def _step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, write_rows: torch.Tensor, read_rows: torch.Tensor,
        k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        scale = self.model.scale
        return self.model.step(input_ids, positions, lambda i, q, k, v: attend_one(q, k, v, k_cache[i], v_cache[i], write_rows, read_rows, scale))

    # Several decode rows: the same step with the eager step's grouped decode attention and the
    # row count dynamic too, 1.4-1.9x the eager step on the shipped Q4_1 weights at every width
    # from 2 to 64 rows (2 threads, Xeon with AMX,
    # ops/results/step-ab-decode-rows-graphs-2026-11-27-xeon-amx.json). Compiling only the
    # layers' dense parts had lost to eager (four graphs; AMD EPYC, bf16 B=32 0.93x, int4 1.06x):
    # the Python between the layers and the attention's small ops are what the whole graph removes.
    def _rows(
        self, input_ids: torch.Tensor, positions: torch.Tensor, write_rows: torch.Tensor, read_rows: torch.Tensor, bias: torch.Tensor,
        keep: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        scale = self.model.scale
        return self.model.step(
            input_ids, positions, lambda i, q, k, v: attend_rows(q, k, v, k_cache[i], v_cache[i], write_rows, read_rows, bias, scale), keep
        )

    # Decode rows beside one prompt chunk (the chunk's context gathered as a later chunk's is).
    # With decode rows compiled, a step that also carries a prompt chunk would run eager at about
    # twice a decode step, so every such step stalls its streams (the stall ratio at c=32 read
    # 3.1-4.2, ops/results/overhead-c32-rows-graphs-vs-no-compile-2026-11-27-xeon-amx.json).
    # Running the decode rows as their graph and the chunk eager beside it (two forwards) was no
    # faster than the eager step (ops/results/step-ab-mixed-split-rows-graph-2026-11-27-xeon-amx.json).
    def _mixed(
        self, input_ids: torch.Tensor, positions: torch.Tensor, write_rows: torch.Tensor, decode_idx: torch.Tensor, read_rows: torch.Tensor,
        bias: torch.Tensor, chunk_idx: torch.Tensor, ctx_rows: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor,
        k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        scale = self.model.scale
        return self.model.step(
            input_ids, positions,
            lambda i, q, k, v: attend_mixed(q, k, v, k_cache[i], v_cache[i], write_rows, decode_idx, read_rows, bias, chunk_idx, ctx_rows, mask, scale), keep,
        )  # fmt: skip

    # A verify step of one stream (its token and a draft of k), the token count and the context
    # both dynamic: 1.4-2.0x faster than eager (SmolLM2 Q4_1, 2 threads, T = 2..5;
    # docs/performance.md's speculative decoding section has the server figures).
    def _few(
        self, input_ids: torch.Tensor, positions: torch.Tensor, write_rows: torch.Tensor, ctx_rows: torch.Tensor, mask: torch.Tensor,
        k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        scale = self.model.scale
        return self.model.step(input_ids, positions, lambda i, q, k, v: attend_few(q, k, v, k_cache[i], v_cache[i], write_rows, ctx_rows, mask, scale))

    def few(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Any, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> torch.Tensor:
        """Logits `[T, V]` of every fed token of a step `applies_few` accepts (once `few_ready`)."""
        batch = step.prefills[0]
        _mark_dynamic((input_ids, (0,)), (positions, (0,)), (step.paged.write_rows, (0,)), (batch.ctx_rows, (0,)), (batch.mask, (2, 3)))  # every token count and context length
        return self.compiled_few(input_ids, positions, step.paged.write_rows, batch.ctx_rows, batch.mask, k_cache, v_cache)

    def rows_ready(self, rows: int) -> bool:
        """Whether the graph of `rows`' width class is compiled (False past the widest class)."""
        i = _class_of(self.classes, rows)
        return i is not None and self._rows_ready[i].is_set()

    def wait_rows_ready(self, timeout: float | None = None) -> bool:
        """Every width class's graph compiled (within `timeout` seconds for each)."""
        return all(ready.wait(timeout) for ready in self._rows_ready)

    def rows(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Any, keep: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> torch.Tensor:
        """Logits `[B, V]` of a step `applies_rows` accepts (once `rows_ready(B)`)."""
        paged = step.paged
        i = _class_of(self.classes, input_ids.shape[0])
        assert i is not None
        # One graph for every width in the class and every context length.
        _mark_dynamic((input_ids, (0,)), (positions, (0,)), (paged.write_rows, (0,)), (paged.decode_rows, (0,)), (paged.decode_bias, (1, 3)), (keep, (0,)))
        return self.compiled_rows[i](input_ids, positions, paged.write_rows, paged.decode_rows, paged.decode_bias, keep, k_cache, v_cache)

    def mixed_ready(self, tokens: int, kept: int) -> bool:
        """Whether the mixed graph of a step of `tokens` tokens keeping `kept` rows is compiled."""
        i = _class_of(self.mixed, tokens)
        lo, hi = self.mixed_keep
        return i is not None and lo <= kept <= hi and self._mixed_ready[i].is_set()

    def wait_mixed_ready(self, timeout: float | None = None) -> bool:
        return all(ready.wait(timeout) for ready in self._mixed_ready)

    def mixed_step(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Any, keep: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> torch.Tensor:
        """Logits of the rows `keep` of a step `applies_mixed` accepts (once `mixed_ready`)."""
        paged, batch = step.paged, step.prefills[0]
        i = _class_of(self.mixed, input_ids.shape[0])
        assert i is not None
        _mark_dynamic(  # one graph for every step in the class
            (input_ids, (0,)), (positions, (0,)), (paged.write_rows, (0,)), (paged.decode_idx, (0,)), (paged.decode_rows, (0,)), (paged.decode_bias, (1, 3)),
            (batch.real_tokens, (0,)), (batch.ctx_rows, (0,)), (batch.mask, (2, 3)), (keep, (0,)),
        )  # fmt: skip
        return self.compiled_mixed[i](
            input_ids, positions, paged.write_rows, paged.decode_idx, paged.decode_rows, paged.decode_bias,
            batch.real_tokens, batch.ctx_rows, batch.mask, keep, k_cache, v_cache,
        )  # fmt: skip

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
        """Compile on a thread of its own while the eager step serves, then swap each graph in:
        the one-row graph first (a single stream's step), then the rows graphs (narrowest width
        class first), the mixed graphs, then the few-token one.

        `scratch_step(seqs)` builds a step in KV blocks no request ever holds (the runner keeps
        them past the blocks it reports), so the compiling calls may write the live caches while
        the device thread runs steps in other rows. The first start pays minutes of inductor
        (on disk after); nothing waits for it.
        """
        if self._thread is not None:  # started already
            return

        def compile_all() -> None:
            self.compile_nice = _lowest_priority()
            for part, run, ready in self._parts(scratch_step, k_cache, v_cache):
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
            refreeze_heap("graphs_compiled")  # the graphs' objects out of full collections (runtime/memory.py)

        self._thread = threading.Thread(target=compile_all, name="switchyard-compile", daemon=True)
        self._thread.start()

    def _parts(
        self, scratch_step: Callable[[list[tuple[int, int]]], tuple[Any, torch.Tensor]], k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
    ) -> list[tuple[str, Callable[[], None], threading.Event]]:
        """Each graph's name, a call that compiles it (in the scratch blocks: what the calls
        write is never read) and the event that swaps it in, in the order they compile."""
        device = k_cache[0].device

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, dtype=torch.long, device=device)

        def one_row() -> None:
            step, positions = scratch_step([(1, 1)])
            self(ones(1), positions, step, k_cache, v_cache)

        def width_class(rows: int) -> Callable[[], None]:
            def run() -> None:
                step, positions = scratch_step([(1, 1)] * rows)
                self.rows(ones(rows), positions, step, torch.arange(rows, device=device), k_cache, v_cache)

            return run

        def mixed_class(tokens: int) -> Callable[[], None]:
            def run() -> None:
                step, positions = scratch_step([(1, 1)] * MIXED_MIN_ROWS + [(1, tokens - MIXED_MIN_ROWS)])
                keep = torch.arange(MIXED_MIN_ROWS, device=device)  # the decode rows: the narrowest kept rows
                self.mixed_step(ones(tokens), positions, step, keep, k_cache, v_cache)

            return run

        def few_tokens() -> None:
            # A quantized linear switches kernels past `max_rows` rows (quant.QuantLinear): a
            # graph for each side, so no draft length compiles on the device thread.
            max_rows = getattr(self.model.linear, "max_rows", MAX_FEW_TOKENS)
            for tokens in sorted({2, min(max_rows + 1, MAX_FEW_TOKENS)}):
                step, positions = scratch_step([(1, tokens)])
                self.few(ones(tokens), positions, step, k_cache, v_cache)

        return [
            ("decode graph (one row, whole step)", one_row, self._ready),
            *((f"decode graph ({lo}-{hi} rows, whole step)", width_class(lo), self._rows_ready[i]) for i, (lo, hi) in enumerate(self.classes)),
            *((f"mixed graph (decode rows and a prompt chunk, {lo}-{hi} tokens)", mixed_class(lo), self._mixed_ready[i]) for i, (lo, hi) in enumerate(self.mixed)),
            ("few-token graph (one row, a draft's verify step)", few_tokens, self._few_ready),
        ]


def _class_of(classes: list[tuple[int, int]], count: int) -> int | None:
    """The index of the class (lo, hi) holding `count`, None past them all."""
    return next((i for i, (lo, hi) in enumerate(classes) if lo <= count <= hi), None)


def _mark_dynamic(*tensors: tuple[torch.Tensor, tuple[int, ...]]) -> None:
    """Each tensor's dims as dynamic: the graph takes every size of them without compiling again."""
    for tensor, dims in tensors:
        for dim in dims:
            torch._dynamo.mark_dynamic(tensor, dim)


def _lowest_priority() -> int | None:
    """The calling thread at nice 19: its niceness then (None where it could not be set).

    The compile takes minutes of a core on a first start on a CPU (2.5-5 min for each graph of
    the embedded model, 2-core Xeon; with inductor's cache warm 10-21 s each, 2026-11-27), while
    the eager step serves: at the default priority it took that core from the step's threads and
    the event loop. At nice 19 it runs on idle cycles only; Linux sets a thread's niceness by its
    id, and what the thread forks (inductor's compiler processes) inherits it."""
    try:
        thread_id = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread_id, 19)
        return os.getpriority(os.PRIO_PROCESS, thread_id)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: compile at the default priority
        log.info("compile_priority_unchanged", error=repr(exc)[:200])
        return None
