"""What each compiled decode graph computes, and which steps each takes.

Owns: the attention each graph traces (`attend_one`: a single row; `attend_rows`: several rows,
as the eager step's grouped decode; `attend_mixed`: decode rows beside one prompt chunk;
`attend_few`: one sequence's few tokens), the width classes that cut the row and token counts
where the step's code branches (dynamo guards each branch, so a graph serves one class), and
the predicates that say which graph a step runs (`applies`, `applies_rows`, `applies_mixed`,
`applies_few`). decode_graph.py compiles them; path.py dispatches by them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from actors.runners.native.attention import write_kv
from actors.runners.paged_attention import FLOAT32_DECODE_MAX_SEQS, float32_decode, grouped_decode_attention


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


def attend_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    write_rows: torch.Tensor, read_rows: torch.Tensor, bias: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """One decode token of each of B sequences: q [B, H, d], k/v [B, KVH, d] → [B, H, d], as the
    eager step's decode attention (paged_attention.grouped_decode_attention): k/v to the cache
    rows `write_rows`, then each sequence's gathered context `read_rows` under the padding `bias`
    [1, B, 1, L] (L, the longest context, read from its shape: dynamic)."""
    k_rows, v_rows = write_kv(k, v, k_cache, v_cache, write_rows)
    return grouped_decode_attention(q.transpose(0, 1), k_rows, v_rows, k_cache.shape[0], read_rows, bias.shape[-1], bias, scale)


def attend_mixed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, write_rows: torch.Tensor,
    decode_idx: torch.Tensor, read_rows: torch.Tensor, bias: torch.Tensor, chunk_idx: torch.Tensor, ctx_rows: torch.Tensor, mask: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """Decode tokens beside one prompt chunk: q [T, H, d], k/v [T, KVH, d] → [T, H, d]. Every
    k/v to the cache first; the decode tokens (`decode_idx`) as `attend_rows`, the chunk's
    (`chunk_idx`) over its gathered context `ctx_rows` under `mask` [1, 1, Tc, L], as
    attention.py's prefill does for one chunk."""
    kv_heads, _, head_dim = k_cache.shape
    k_rows, v_rows = write_kv(k, v, k_cache, v_cache, write_rows)
    out = torch.empty_like(q)
    out[decode_idx] = grouped_decode_attention(q[decode_idx].transpose(0, 1), k_rows, v_rows, kv_heads, read_rows, bias.shape[-1], bias, scale)
    tokens = chunk_idx.shape[0]
    length = ctx_rows.shape[0] // kv_heads
    keys = k_rows.index_select(0, ctx_rows).view(1, kv_heads, length, head_dim)
    values = v_rows.index_select(0, ctx_rows).view(1, kv_heads, length, head_dim)
    chunk = F.scaled_dot_product_attention(q[chunk_idx].view(1, tokens, -1, head_dim).transpose(1, 2), keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    out[chunk_idx] = chunk.transpose(1, 2).reshape(tokens, -1, head_dim)
    return out


def cuts(linear: Any, lowest: int, highest: int, attention: bool) -> list[tuple[int, int]]:
    """`lowest`..`highest` cut where the step's code branches on a count: a quantized linear's
    kernels (up to `max_rows`, past `dense_rows`: the step's tokens) and, with `attention`, the
    grouped decode's float32 path (up to FLOAT32_DECODE_MAX_SEQS: its decode rows)."""
    counts = (FLOAT32_DECODE_MAX_SEQS if attention else None, getattr(linear, "max_rows", None), getattr(linear, "dense_rows", None))
    points = sorted({c for c in counts if c is not None and lowest <= c < highest})
    lows = [lowest, *(c + 1 for c in points)]
    return [(lo, hi) for lo, hi in zip(lows, [*points, highest], strict=True)]


def width_classes(linear: Any, max_rows: int) -> list[tuple[int, int]]:
    """The row counts 2..`max_rows` cut where the step's code branches on them: the attention's
    float32 path (up to FLOAT32_DECODE_MAX_SEQS rows) and a quantized linear's kernels (up to
    `max_rows`, past `dense_rows`). Within a class every step takes the same branches, so one
    graph with a dynamic row count serves the whole class."""
    return cuts(linear, 2, max_rows, attention=True)


# A mixed step (decode rows beside one prompt chunk) runs its graph from this many decode rows:
# past the grouped decode's float32 path, so only the step's token count picks a class.
MIXED_MIN_ROWS = FLOAT32_DECODE_MAX_SEQS + 1


def mixed_classes(linear: Any, max_tokens: int) -> list[tuple[int, int]]:
    """A mixed step's token counts (MIXED_MIN_ROWS decode rows and a chunk of 2 at the least, up
    to the step's token budget) cut where the quantized linear switches kernels."""
    return cuts(linear, MIXED_MIN_ROWS + 2, max(max_tokens, MIXED_MIN_ROWS + 2), attention=False)


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


def applies_rows(input_ids: torch.Tensor, step: Any, keep: torch.Tensor) -> bool:
    """A step a rows graph runs: one decode token of each of 2 or more sequences, each row kept
    (sampled), nothing else."""
    paged = step.paged
    rows = input_ids.shape[0]
    return (
        rows >= 2
        and keep.shape[0] == rows
        and not step.prefills
        and paged.decode_idx is not None
        and paged.decode_idx.shape[0] == rows
        and paged.decode_rows is not None
        and paged.decode_bias is not None
        and not paged.per_sequence_decode
        and paged.decode_len >= 2  # a context of 1 (one-token prompts alone) would specialise the length and compile again
    )


def applies_mixed(input_ids: torch.Tensor, step: Any) -> bool:
    """A step a mixed graph runs: MIXED_MIN_ROWS or more decode tokens beside one prompt chunk
    whose context is gathered (attention.build_step's `gather_fresh` for a fresh one)."""
    paged = step.paged
    if len(step.prefills) != 1 or paged.decode_idx is None or paged.decode_idx.shape[0] < MIXED_MIN_ROWS:
        return False
    batch = step.prefills[0]
    return batch.num_chunks == 1 and batch.ctx_rows is not None and not paged.per_sequence_decode and paged.decode_len >= 2 and paged.decode_bias is not None


MAX_FEW_TOKENS = 8  # a draft of up to 7 tokens and the token before it
# The scratch KV a compiled path keeps for its compiling calls: the longest is a mixed step's
# chunk after one token of context (its widest class's narrowest step) or a few-token step.
SCRATCH_TOKENS = 64


def applies_few(input_ids: torch.Tensor, step: Any) -> bool:
    """A step the few-token graph runs: one sequence fed 2..MAX_FEW_TOKENS tokens after a
    context in the cache, nothing else."""
    if len(step.prefills) != 1 or step.paged.decode_idx is not None:
        return False
    batch = step.prefills[0]
    return batch.num_chunks == 1 and batch.ctx_rows is not None and 2 <= input_ids.shape[0] <= MAX_FEW_TOKENS
