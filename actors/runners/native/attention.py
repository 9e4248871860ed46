"""Paged attention for the native model: the cache written in place, one batched call per kind.

Owns: `NativeStep` (a step's cache indices, built once and shared by every layer) and
`attend()`, one layer's attention over our paged KV cache.

The cache is the runner's: per layer a head-major `[kv_heads, num_slots, head_dim]` tensor
(paged_attention.py says why that layout, beside `cache_rows`). Decode tokens go through
paged_attention's grouped decode kernel (two batched matmuls over a padded gather). Prefill
chunks are attended together too: queries padded to the longest chunk `[P, Qmax]`, keys
gathered to the longest context `[P, Lmax]`, one SDPA call with a boolean mask, so a step
never loops over its sequences in Python. When every chunk is a fresh prompt (the common
first step of requests) the gather is skipped: each uses its own keys with `is_causal`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from actors.runners import paged_attention
from actors.runners.paged_attention import PagedStep


@dataclass(slots=True)
class PrefillBatch:
    tokens: torch.Tensor  # [P * Qmax] packed-step index of each padded query (pads repeat a real one)
    real: torch.Tensor  # [Tp] positions in the padded [P * Qmax] of the real queries
    real_tokens: torch.Tensor  # [Tp] their packed-step indices
    num_chunks: int
    max_q: int
    ctx_rows: torch.Tensor | None = None  # [KVH * P * Lmax] cache rows (None: one fresh chunk, no gather)
    max_ctx: int = 0
    mask: torch.Tensor | None = None  # [P, 1, Qmax, Lmax] bool, True = attend


@dataclass(slots=True)
class NativeStep:
    paged: PagedStep  # write rows and the decode group(s)
    # One batch of every prefill chunk; in batch-invariant mode one per chunk, so a chunk's
    # padded shapes (and so its rounding) never depend on the chunks beside it.
    prefills: list[PrefillBatch]


def build_step(
    seqs: list[tuple[int, int]],
    block_tables: list[list[int]],
    block_size: int,
    k_cache: list[torch.Tensor],
    v_cache: list[torch.Tensor],
    per_sequence_decode: bool = False,
    gather_fresh: bool = False,
) -> tuple[NativeStep, torch.Tensor]:
    """A packed step's indices; `seqs` holds (start_pos, num_new_tokens) per sequence.
    `gather_fresh`: fresh prompt chunks are attended over their keys gathered from the cache
    too, as chunks with a context are (the compiled mixed step reads every chunk that way)."""
    paged, positions = paged_attention.build_step(
        seqs, block_tables, block_size, k_cache, v_cache, per_sequence_decode, chunk_metadata=False
    )
    chunks = [(start, n, table, cursor) for (start, n), table, cursor in zip(seqs, block_tables, _cursors(seqs)) if n > 1]
    groups = [[chunk] for chunk in chunks] if per_sequence_decode else [chunks] if chunks else []
    prefills = [_prefill_batch(group, block_size, k_cache[0].shape, positions.device, gather_fresh) for group in groups]
    return NativeStep(paged=paged, prefills=prefills), positions


def _cursors(seqs: list[tuple[int, int]]) -> list[int]:
    out, cursor = [], 0
    for _, n in seqs:
        out.append(cursor)
        cursor += n
    return out


def _prefill_batch(
    chunks: list[tuple[int, int, list[int], int]], block_size: int, cache_shape: torch.Size, device: torch.device, gather_fresh: bool = False
) -> PrefillBatch:
    kv_heads, num_slots, _ = cache_shape
    max_q = max(n for _, n, _, _ in chunks)
    q_off = torch.arange(max_q)
    counts = torch.tensor([n for _, n, _, _ in chunks])
    cursors = torch.tensor([c for _, _, _, c in chunks])
    valid = q_off[None, :] < counts[:, None]  # [P, Qmax]
    tokens = cursors[:, None] + torch.where(valid, q_off[None, :], 0)
    batch = PrefillBatch(
        tokens=tokens.reshape(-1).to(device),
        real=valid.reshape(-1).nonzero().squeeze(-1).to(device),
        real_tokens=tokens[valid].to(device),
        num_chunks=len(chunks),
        max_q=max_q,
    )
    if not gather_fresh and all(start == 0 for start, _, _, _ in chunks):
        return batch  # fresh prompts: each attends over its own new keys, causally (see _prefill)
    ctx = torch.tensor([start + n for start, n, _, _ in chunks])
    batch.max_ctx = max_ctx = int(ctx.max())
    max_blocks = -(-max_ctx // block_size)
    tables = torch.zeros(len(chunks), max_blocks, dtype=torch.long)
    for row, (_, _, table, _) in enumerate(chunks):
        used = table[:max_blocks]
        tables[row, : len(used)] = torch.tensor(used, dtype=torch.long)
    slots = (tables[:, :, None] * block_size + torch.arange(block_size)).reshape(len(chunks), -1)[:, :max_ctx]
    batch.ctx_rows = (torch.arange(kv_heads)[:, None, None] * num_slots + slots[None]).reshape(-1).to(device)
    q_pos = torch.tensor([start for start, _, _, _ in chunks])[:, None] + torch.where(valid, q_off[None, :], 0)
    key_pos = torch.arange(max_ctx)
    batch.mask = ((key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos[None, None, :] < ctx[:, None, None]))[:, None].to(device)
    return batch


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step: NativeStep, scale: float
) -> torch.Tensor:
    """q [T, H, d], k/v [T, KVH, d] (rotary applied) → [T, H, d]; k/v written to the cache first."""
    kv_heads = k_cache.shape[0]
    paged = step.paged
    k_rows, v_rows = write_kv(k, v, k_cache, v_cache, paged.write_rows)
    if not step.prefills and paged.decode_idx is not None and paged.decode_idx.shape[0] == q.shape[0]:
        return paged_attention.decode_attention(q.transpose(0, 1), k_rows, v_rows, kv_heads, paged, scale)
    out = q.new_empty(q.shape)
    if paged.decode_idx is not None:
        out[paged.decode_idx] = paged_attention.decode_attention(q[paged.decode_idx].transpose(0, 1), k_rows, v_rows, kv_heads, paged, scale)
    for batch in step.prefills:
        out[batch.real_tokens] = _prefill(q, k, v, k_rows, v_rows, kv_heads, batch, scale)
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """New keys and values [T, KVH, d] into the layer's cache rows `rows` ([KVH * T], head-major);
    the cache as `[KVH * num_slots, d]` rows, for the gathers that follow."""
    head_dim = k_cache.shape[-1]
    k_rows = k_cache.view(-1, head_dim)
    v_rows = v_cache.view(-1, head_dim)
    k_rows.index_copy_(0, rows, k.transpose(0, 1).reshape(-1, head_dim))
    v_rows.index_copy_(0, rows, v.transpose(0, 1).reshape(-1, head_dim))
    return k_rows, v_rows


def _prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, kv_heads: int, batch: PrefillBatch, scale: float
) -> torch.Tensor:
    """Every prefill chunk in one SDPA call → the real queries' outputs [Tp, H, d]."""
    head_dim = q.shape[-1]
    p, qmax = batch.num_chunks, batch.max_q
    qp = q[batch.tokens].view(p, qmax, -1, head_dim).transpose(1, 2)  # [P, H, Qmax, d]
    if batch.ctx_rows is None:
        # Fresh chunks: a chunk's own keys are its whole context. Padding sits after each
        # chunk's real tokens, so the causal mask alone keeps real queries off the pads.
        kp = k[batch.tokens].view(p, qmax, kv_heads, head_dim).transpose(1, 2)
        vp = v[batch.tokens].view(p, qmax, kv_heads, head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=True)
    else:
        kp = k_rows.index_select(0, batch.ctx_rows).view(kv_heads, p, batch.max_ctx, head_dim).transpose(0, 1)
        vp = v_rows.index_select(0, batch.ctx_rows).view(kv_heads, p, batch.max_ctx, head_dim).transpose(0, 1)
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=batch.mask, scale=scale, enable_gqa=True)
    return o.transpose(1, 2).reshape(p * qmax, -1, head_dim)[batch.real]
