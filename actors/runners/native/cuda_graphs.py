"""Steps in fixed-shape buckets, each captured once as a CUDA graph and replayed.

Owns: `BucketedDecode`, which runs a step padded to a batch bucket and a key-length bucket
through one static function over static input buffers, capturing each (batch, length) bucket
as a CUDA graph at warm-up or on its first use; `DecodeBatch`, a step planned into its bucket;
and `decode_step`, the static function itself.

Why: on a GPU the decode step of a small model is bound by launching its kernels (a few
hundred per step from Python, ~10 us each), not by the GPU's arithmetic; a graph replays them
all in one launch. Every token of a step is a row (a decode token, or each token of a prompt
chunk or of a draft to verify), so a step with prompt chunks replays too instead of running
eager and stalling the streams beside it (comment on `BucketedDecode.plan`).

A replay runs the captured kernels on the captured addresses and shapes, so everything that
changes between steps (tokens, block tables, lengths) is copied into buffers the graph reads,
and nothing in the step may depend on a value at capture time: no host sync, no data-dependent
shape (`tests/engine/test_native_cuda_graphs.py` checks). On CPU (`capture=False`) the same
function runs uncaptured, which is how the CPU suite checks it; serving on a CPU uses the
faster unpadded eager step (native/path.py turns graphs on for CUDA only).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from actors.runners.native.attention import write_kv
from actors.runners.paged_attention import cache_rows, grouped_decode_attention, padding_bias, table_slots
from actors.runners.step_index import padded_tables
from runtime.logging import get_logger

log = get_logger("runner")

# Padding a step of B rows to the next bucket wastes at most a third of the bucket past 16 rows.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# A step with prompt chunks gathers each of its rows' keys and values: at most this many
# elements each, 256 MiB in bf16 (512 rows x 1,024 keys of the embedded model's 3 x 64 fit).
MIXED_GATHER_ELEMENTS = 1 << 27
# The length buckets (powers of two from 256 tokens to the model's length) bound what a gather
# reads to 2x the longest context in the step.
MIN_LENGTH_BUCKET = 256
# torch allows one capture at a time in a process; models on several GPUs capture in turn.
_CAPTURE_LOCK = threading.Lock()


def batch_bucket(batch: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int | None:
    """The smallest batch bucket that holds `batch` rows; None past the largest (runs eager)."""
    return next((b for b in buckets if b >= batch), None)


def length_buckets(max_len: int, block_size: int) -> list[int]:
    """Key-length buckets in tokens, each a whole number of blocks: 256, 512, ... up to the
    first one that holds `max_len`."""
    top = -(-max_len // block_size) * block_size
    out, length = [], -(-MIN_LENGTH_BUCKET // block_size) * block_size
    while length < top:
        out.append(length)
        length *= 2
    out.append(top)
    return out


@dataclass(slots=True)
class DecodeBatch:
    """A step planned into its bucket, a row per token (host-side lists; nothing on the device yet)."""

    lens: list[int]  # each row's length including its own token (its position + 1)
    tables: list[list[int]]  # each row's sequence's block table
    batch: int  # the batch bucket
    length: int  # the key-length bucket, in tokens


# Attention: inside the graph each sequence's block table expands to its cache rows, the new
# token's key and value are written in place, and the keys and values are gathered to the
# bucket's length and attended by the same two grouped matmuls as the eager decode
# (paged_attention.grouped_decode_attention), under a -inf bias past each sequence's own length
# computed in the graph. Not SDPA: with a mask, flash attention is out and the memory-efficient
# kernel takes no grouped-query heads, so SDPA would fall back to its math kernel, which repeats
# K/V for every query head and upcasts them. Every row writes its key and value before any row
# gathers, so a chunk's token sees the chunk's earlier tokens as a decode token sees its context.
def decode_step(
    model: Any,
    input_ids: torch.Tensor,
    lens: torch.Tensor,
    tables: torch.Tensor,
    k_cache: list[torch.Tensor],
    v_cache: list[torch.Tensor],
    block_size: int,
) -> torch.Tensor:
    """One token per row over fixed shapes: input_ids and lens `[B]`, tables
    `[B, L / block_size]` → logits `[B, V]`. Writes each row's key and value to its slot, then
    attends each row over its sequence's first `lens` keys."""
    kv_heads, num_slots, _ = k_cache[0].shape
    blocks = tables.shape[1]
    length = blocks * block_size
    positions = lens - 1
    write_slots = tables.gather(1, (positions // block_size)[:, None]).squeeze(1) * block_size + positions % block_size
    write_rows = cache_rows(write_slots, kv_heads, num_slots)  # [KVH * B], head-major as the cache
    read_rows = cache_rows(table_slots(tables, block_size, length).reshape(-1), kv_heads, num_slots)  # [KVH * B * L]
    bias = padding_bias(lens, length)
    adapters = getattr(model, "adapters", None)  # LoRA: each row's from static buffers (native/lora.py)
    if adapters is not None:
        adapters.in_graph = True
    try:
        return model.step(input_ids, positions, lambda i, q, k, v: attend_gathered(q, k, v, k_cache[i], v_cache[i], write_rows, read_rows, bias, model.scale))
    finally:
        if adapters is not None:
            adapters.in_graph = False


def attend_gathered(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    write_rows: torch.Tensor, read_rows: torch.Tensor, bias: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """q [B, H, d], k/v [B, KVH, d] → [B, H, d]: k/v to the cache rows `write_rows` first, then
    each row's gathered context (`read_rows`, head-major) attended with the padding `bias`
    [1, B, 1, L]."""
    k_rows, v_rows = write_kv(k, v, k_cache, v_cache, write_rows)
    return grouped_decode_attention(q.transpose(0, 1), k_rows, v_rows, k_cache.shape[0], read_rows, bias.shape[-1], bias, scale)


class BucketedDecode:
    """Steps through fixed-shape buckets, a row per token; on CUDA one captured graph per bucket."""

    def __init__(
        self, model: Any, vocab_size: int, max_len: int, block_size: int, device: torch.device, capture: bool, max_num_seqs: int = 256, max_step_tokens: int = 0,
    ) -> None:  # fmt: skip
        self.model = model
        self.block_size = block_size
        self.device = device
        self.capture = capture
        self.lengths = length_buckets(max_len, block_size)
        self.gather_row = model.cfg.num_kv_heads * model.cfg.head_dim  # elements a row gathers per key
        # No bucket past what the engine ever schedules: a row per sequence, or per token of the step.
        top = batch_bucket(max(max_num_seqs, max_step_tokens)) or BATCH_BUCKETS[-1]
        self.batches = tuple(b for b in BATCH_BUCKETS if b <= top)
        max_batch, max_blocks = self.batches[-1], self.lengths[-1] // block_size
        # The static buffers every bucket reads and writes (views of them keep their address).
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.lens = torch.ones(max_batch, dtype=torch.long, device=device)
        self.tables = torch.zeros(max_batch, max_blocks, dtype=torch.long, device=device)
        self.logits = torch.zeros(max_batch, vocab_size, dtype=model.w.embed.dtype, device=device)
        self.runs: dict[tuple[int, int], Callable[[], None]] = {}  # (batch, length) -> replay
        self._k_cache: list[torch.Tensor] | None = None
        self._pool: Any = None

    # A prompt chunk's token (or a draft's, to verify) is a row whose length is its own position
    # plus one, reading its sequence's block table. Steps with prompt chunks go through the
    # graphs too: eager, such a step is launch-bound on a GPU (23-53 ms for the embedded model's
    # shape on an H100 against 4-6 ms for a decode step replayed, whatever the chunk:
    # ops/results/gpu-check-first-run-2026-11-26-h100.json and its second run), so every prompt
    # stalled the streams beside it by ten decode steps. Where a chunk's gather would be large
    # (rows x key length x kv heads x head dim past `MIXED_GATHER_ELEMENTS`) the step runs eager,
    # where SDPA reads the cache once per chunk instead of once per row.
    def plan(self, seqs: list[tuple[int, int]], tables: list[list[int]]) -> DecodeBatch | None:
        """The step's bucket, a row per token, if it fits one; None: run it eager."""
        if not seqs:
            return None
        rows = sum(n for _, n in seqs)
        batch = batch_bucket(rows, self.batches)
        length = next((b for b in self.lengths if b >= max(start + n for start, n in seqs)), None)
        if batch is None or length is None:
            return None
        if rows == len(seqs):  # decode-only
            return DecodeBatch(lens=[start + 1 for start, _ in seqs], tables=tables, batch=batch, length=length)
        if batch * length * self.gather_row > MIXED_GATHER_ELEMENTS:
            return None
        lens = [pos + 1 for start, n in seqs for pos in range(start, start + n)]
        return DecodeBatch(lens=lens, tables=[table for (_, n), table in zip(seqs, tables) for _ in range(n)], batch=batch, length=length)

    # Longer contexts capture their bucket on first use (as vLLM and nano-vllm do). Captures are
    # serialised process-wide and `thread_local`, so a model on another GPU (its own device
    # thread) keeps stepping while this one captures, and each runs on its own device's stream.
    def capture_all(self, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> None:
        """Prepare every batch bucket at the first length bucket, largest first, so that serving
        rarely captures. Each step writes block 0's first slot (the runner zeroes it after its
        warm-up)."""
        started = time.perf_counter()
        for batch in reversed(self.batches):
            plan = DecodeBatch(lens=[1], tables=[[0]], batch=batch, length=self.lengths[0])
            self(torch.zeros(1, dtype=torch.long, device=self.device), plan, torch.zeros(1, dtype=torch.long, device=self.device), k_cache, v_cache)
        log.info("cuda_graphs_ready", graphs=len(self.runs), captured=self.capture, seconds=round(time.perf_counter() - started, 2))

    def __call__(self, input_ids: torch.Tensor, plan: DecodeBatch, keep: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> torch.Tensor:
        """Logits `[len(keep), V]` of the step's rows `keep` (a copy, not the static buffer)."""
        self._fill(input_ids, plan)
        if k_cache is not self._k_cache:  # graphs hold the cache's addresses: a new cache (the runner's load) needs new ones
            self.runs.clear()
            self._k_cache = k_cache
        key = (plan.batch, plan.length)
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = self._prepare(plan.batch, plan.length, k_cache, v_cache)
        run()
        return self.logits.index_select(0, keep)

    # Pads: a bucket's spare rows repeat the last real sequence (token, table, length). They
    # compute that sequence's keys and values and write them to its slot, the same values, so
    # the duplicate writes cannot corrupt it; their logits are dropped.
    def _fill(self, input_ids: torch.Tensor, plan: DecodeBatch) -> None:
        """Copy the step into the static buffers; pad rows repeat the last real sequence."""
        real, blocks = len(plan.lens), plan.length // self.block_size
        rows = padded_tables(plan.tables, blocks)
        tables = torch.from_numpy(np.concatenate([rows, np.repeat(rows[-1:], plan.batch - real, axis=0)]))  # built whole: one tensor, one copy
        lens = torch.tensor(plan.lens + [plan.lens[-1]] * (plan.batch - real), dtype=torch.long)
        self.tables[: plan.batch, :blocks].copy_(tables.to(self.device, non_blocking=True))
        self.lens[: plan.batch].copy_(lens.to(self.device, non_blocking=True))
        self.input_ids[:real].copy_(input_ids)
        self.input_ids[real : plan.batch] = input_ids[-1]

    def _prepare(self, batch: int, length: int, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> Callable[[], None]:
        """The bucket's run: on CUDA a captured graph's replay, else the static function."""
        blocks = length // self.block_size
        ids, lens, tables, logits = self.input_ids[:batch], self.lens[:batch], self.tables[:batch, :blocks], self.logits[:batch]

        def run() -> None:
            logits.copy_(decode_step(self.model, ids, lens, tables, k_cache, v_cache, self.block_size))

        if not self.capture:
            return run
        started = time.perf_counter()
        with _CAPTURE_LOCK, torch.cuda.device(self.device):
            # Warm-up on a side stream before capture, as torch.cuda.graphs documents: lazy
            # initialisation (cuBLAS workspaces, autotuning) must not happen inside the capture.
            # The runs write the step's own keys and values, which the replay writes again.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            # One memory pool for every bucket's graph: only one replays at a time, and what a
            # replay leaves behind (the logits) lives in the static buffer outside the pool.
            # thread_local: another device thread's CUDA calls during this capture are its own.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=torch.cuda.Stream(self.device), capture_error_mode="thread_local"):
                run()
        log.info("cuda_graph_captured", batch=batch, length=length, graphs=len(self.runs) + 1, seconds=round(time.perf_counter() - started, 3))

        def replay() -> None:
            with torch.cuda.device(self.device):
                graph.replay()

        return replay
