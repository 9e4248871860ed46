"""Paged attention for any transformers model, through transformers' attention interface.

Owns: the per-step attention metadata (`PagedStep`), the function registered with
`AttentionInterface` under the name `switchyard_paged`, and the KV cache tensors' layout.

Why this shape: transformers lets a model's attention layers call a registered function with
(query, key, value) after the projections and rotary embeddings are applied. Doing the cache
read/write there means every transformers causal LM runs packed, paged batches without
re-implementing the model. The whole step is one sequence of T tokens (batch dimension 1):
prefill chunks and decode tokens side by side, each with its own position ids.

Cache layout: per layer a head-major `[num_kv_heads, num_slots, head_dim]` tensor, slot = block *
block_size + offset, read and written as `[kv_heads * num_slots, head_dim]` rows (`cache_rows`
says why). Decode tokens (one query each) are attended together in two grouped batched matmuls
over a padded gather; each prefill chunk gets its own SDPA call (a fresh prompt chunk uses its
own keys with `is_causal`, skipping the gather entirely).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from actors.runners.step_index import StepIndex

ATTN_NAME = "switchyard_paged"


@dataclass(slots=True)
class PrefillChunk:
    start: int  # token range in the packed step
    end: int
    fresh: bool  # starts at position 0: attends only over its own keys
    rows: torch.Tensor | None = None  # [kv_heads * ctx] cache rows of positions 0..ctx-1
    mask: torch.Tensor | None = None  # [q, ctx] bool, True = attend


@dataclass(slots=True)
class PagedStep:
    k_cache: list[torch.Tensor]
    v_cache: list[torch.Tensor]
    write_rows: torch.Tensor  # [kv_heads * T] cache rows where each new token's K/V goes
    decode_idx: torch.Tensor | None = None  # [B] token indices of one-token sequences
    decode_rows: torch.Tensor | None = None  # [kv_heads * B * Lmax] gathered rows (padding: slot 0)
    decode_len: int = 0  # Lmax
    decode_bias: torch.Tensor | None = None  # [1, B, 1, Lmax] float32: 0 or -inf (padding)
    decode_lens: list[int] = field(default_factory=list)  # [B] each sequence's own length
    # Batch-invariant mode: a decode sequence's keys are padded to its own length's bucket
    # (INVARIANT_KV_BUCKET), never to the longest sequence beside it, and sequences of one
    # bucket are attended together: a row of a batched matmul or softmax comes out bit-identical
    # whatever the batch count, so its result depends on its own length alone (TorchRunner's
    # batch_invariant). One pair of matmuls per bucket, not per sequence.
    per_sequence_decode: bool = False
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    layers_seen: int = 0  # attention calls this step so far (the start-up check counts them)


INVARIANT_KV_BUCKET = 64
# Up to this many decode sequences the two attention matmuls run in float32: tiny bf16 batched
# matmuls cost several times their float32 twins on CPU (oneDNN makes a new primitive for every
# key length, and the length grows each step). Interleaved, 1 thread, SmolLM2 int4 on this EPYC:
# 1.34x the whole step at 1 sequence, 1.08x at 4, 0.95x at 16 (casting the gathered keys costs
# more than it saves). Not in batch-invariant mode: a group's numerics must not depend on its size.
FLOAT32_DECODE_MAX_SEQS = 4


@dataclass(slots=True)
class DecodeGroup:
    """Decode sequences attended together over one padded key length."""

    members: torch.Tensor  # [Bg] their indices among the step's decode sequences
    rows: torch.Tensor  # [kv_heads * Bg * length] gathered cache rows (padding: slot 0)
    length: int
    bias: torch.Tensor  # [1, Bg, 1, length] float32: 0 or -inf (padding)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged_step: PagedStep | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, d], key/value [1, KVH, T, d] → output [1, T, H, d]."""
    step = paged_step
    assert step is not None, "switchyard_paged attention needs paged_step= in the forward call"
    layer = module.layer_idx
    step.layers_seen += 1
    kv_heads, _, head_dim = step.k_cache[layer].shape
    k_rows = step.k_cache[layer].view(-1, head_dim)
    v_rows = step.v_cache[layer].view(-1, head_dim)
    k_rows.index_copy_(0, step.write_rows, key[0].reshape(-1, head_dim))
    v_rows.index_copy_(0, step.write_rows, value[0].reshape(-1, head_dim))

    num_tokens = query.shape[2]
    out = query.new_empty(num_tokens, query.shape[1], query.shape[3])  # [T, H, d]
    if step.decode_idx is not None:
        out[step.decode_idx] = decode_attention(query[0][:, step.decode_idx], k_rows, v_rows, kv_heads, step, scaling)
    for chunk in step.prefills:
        q = query[:, :, chunk.start : chunk.end]
        if chunk.fresh:
            k = key[:, :, chunk.start : chunk.end]
            v = value[:, :, chunk.start : chunk.end]
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
        else:
            k = k_rows.index_select(0, chunk.rows).view(1, kv_heads, -1, head_dim)
            v = v_rows.index_select(0, chunk.rows).view(1, kv_heads, -1, head_dim)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=chunk.mask, scale=scaling, enable_gqa=True)
        out[chunk.start : chunk.end] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


def decode_attention(
    q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, kv_heads: int, step: PagedStep, scaling: float | None
) -> torch.Tensor:
    """One query per sequence: q [H, B, d] → [B, H, d].

    Two grouped batched matmuls instead of SDPA: on CPU, SDPA with a padding mask and GQA
    measured ~13x slower for these shapes (4.6 ms vs 0.35 ms a layer at B=32, L=150, bf16).
    Query heads are grouped per KV head exactly as transformers' `repeat_kv` pairs them (head h
    reads KV head h // group). Batch dims are (kv head, sequence) so the gathered cache is used
    as it comes, with no copy; softmax runs in float32.
    """
    num_heads, batch, head_dim = q.shape
    scale = scaling if scaling is not None else head_dim**-0.5
    if not step.per_sequence_decode:
        assert step.decode_rows is not None and step.decode_bias is not None
        return grouped_decode_attention(q, k_rows, v_rows, kv_heads, step.decode_rows, step.decode_len, step.decode_bias, scale)
    qg = q.reshape(kv_heads, num_heads // kv_heads, batch, head_dim).transpose(1, 2)  # [KVH, B, G, d]
    out = qg.new_empty(qg.shape)
    for group in step.decode_groups:
        out[:, group.members] = _grouped_decode(qg[:, group.members], k_rows, v_rows, group.rows, group.length, group.bias, scale, 0)
    return out.permute(1, 0, 2, 3).reshape(batch, num_heads, head_dim)


def grouped_decode_attention(
    q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, kv_heads: int, rows: torch.Tensor, length: int, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [H, B, d] over each sequence's gathered cache rows `rows` ([kv_heads * B * length],
    head-major) with the padding `bias` [1, B, 1, length] → [B, H, d] (also traced into the
    CUDA graphs' bucketed decode step, actors/runners/native/cuda_graphs.py)."""
    num_heads, batch, head_dim = q.shape
    qg = q.reshape(kv_heads, num_heads // kv_heads, batch, head_dim).transpose(1, 2)  # [KVH, B, G, d]
    out = _grouped_decode(qg, k_rows, v_rows, rows, length, bias, scale, FLOAT32_DECODE_MAX_SEQS)
    return out.permute(1, 0, 2, 3).reshape(batch, num_heads, head_dim)


def _grouped_decode(
    qg: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    rows: torch.Tensor,
    length: int,
    bias: torch.Tensor,
    scale: float,
    float32_max_seqs: int,
) -> torch.Tensor:
    """qg [KVH, B, G, d] over B sequences' gathered keys of `length` → [KVH, B, G, d]."""
    kv_heads, batch, _, head_dim = qg.shape
    k = k_rows.index_select(0, rows).view(kv_heads, batch, length, head_dim)
    v = v_rows.index_select(0, rows).view(kv_heads, batch, length, head_dim)
    if batch <= float32_max_seqs:
        return float32_decode(qg, k, v, bias, scale)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * scale + bias  # [KVH, B, G, L]
    return torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)


def float32_decode(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | float, scale: float) -> torch.Tensor:
    """qg [KVH, B, G, d] over keys and values [KVH, B, L, d] with the padding `bias`, in float32
    (also traced into the native one-row decode graph, actors/runners/native/decode_graph.py)."""
    scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)) * scale + bias
    return torch.matmul(scores.softmax(dim=-1), v.float()).to(v.dtype)


def _no_mask(*args: object, **kwargs: object) -> None:
    # The paged function builds its own masks from PagedStep; transformers must not build a
    # [T, T] mask for the packed step (it would be wrong across sequences, and large).
    return None


def register() -> None:
    """Make `attn_implementation="switchyard_paged"` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, _no_mask)


def build_step(
    seqs: list[tuple[int, int]],
    block_tables: list[list[int]],
    block_size: int,
    k_cache: list[torch.Tensor],
    v_cache: list[torch.Tensor],
    per_sequence_decode: bool = False,
    chunk_metadata: bool = True,
) -> tuple[PagedStep, torch.Tensor]:
    """Metadata for a packed step. `seqs` holds (start_pos, num_new_tokens) per sequence.

    Returns the step and the position ids `[T]`. Index math runs on the CPU in int64 and is
    moved to the cache's device once. `chunk_metadata=False` skips the per-chunk gather rows
    and masks (the native path batches its prefill chunks itself).
    """
    device = k_cache[0].device
    kv_heads, num_slots, _ = k_cache[0].shape
    index = StepIndex.of(seqs, block_tables, block_size)
    decoding = index.counts == 1
    prefills: list[PrefillChunk] = []
    chunk_meta: list[tuple[PrefillChunk, list[int], int]] = []
    if not index.decode_only:
        for (start, num_new), table, cursor in zip(seqs, block_tables, index.cursors.tolist()):
            if num_new > 1:
                chunk = PrefillChunk(start=cursor, end=cursor + num_new, fresh=start == 0)
                prefills.append(chunk)
                if not chunk.fresh and chunk_metadata:
                    chunk_meta.append((chunk, table, start))
    lens = index.starts[decoding] + 1
    step = PagedStep(
        k_cache=k_cache,
        v_cache=v_cache,
        write_rows=torch.from_numpy(_host_cache_rows(index.slots, kv_heads, num_slots)).to(device),
        prefills=prefills,
        decode_lens=lens.tolist(),
        per_sequence_decode=per_sequence_decode,
    )
    if len(lens):
        step.decode_idx = torch.from_numpy(index.cursors[decoding]).to(device)
        _decode_metadata(step, index.tables[decoding], lens, block_size, kv_heads, num_slots, device)
    for chunk, table, start in chunk_meta:
        ctx = start + (chunk.end - chunk.start)
        chunk.rows = cache_rows(_slots_of(table, ctx, block_size), kv_heads, num_slots).to(device)
        q_pos = torch.arange(start, ctx, device=device)
        chunk.mask = torch.arange(ctx, device=device)[None, :] <= q_pos[:, None]
    return step, torch.from_numpy(index.positions).to(device)


def _decode_metadata(step: PagedStep, tables: np.ndarray, lens: np.ndarray, block_size: int, kv_heads: int, num_slots: int, device: torch.device) -> None:
    """The decode group's gather rows and padding bias (batch-invariant mode: one per bucket)."""
    if step.per_sequence_decode:
        step.decode_groups = _invariant_groups(tables, step.decode_lens, block_size, kv_heads, num_slots, device)
        return
    slots, bias = _decode_gather(tables, lens, block_size)
    step.decode_rows = torch.from_numpy(_host_cache_rows(slots, kv_heads, num_slots)).to(device)
    step.decode_bias = torch.from_numpy(bias).to(device)
    step.decode_len = slots.shape[1]


def copy_blocks(
    k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], copies: list[tuple[int, int]], block_size: int
) -> None:
    """Copy whole KV blocks (source, destination) in every layer: copy-on-write for forks."""
    kv_heads, num_slots, head_dim = k_cache[0].shape
    offsets = torch.arange(block_size, dtype=torch.long)
    src = cache_rows((torch.tensor([c[0] for c in copies])[:, None] * block_size + offsets).reshape(-1), kv_heads, num_slots)
    dst = cache_rows((torch.tensor([c[1] for c in copies])[:, None] * block_size + offsets).reshape(-1), kv_heads, num_slots)
    src, dst = src.to(k_cache[0].device), dst.to(k_cache[0].device)
    for cache in (*k_cache, *v_cache):
        rows = cache.view(-1, head_dim)
        rows.index_copy_(0, dst, rows.index_select(0, src))


# New keys/values are scattered to their slots with `index_copy_`; attention then gathers each
# sequence's slots with `index_select` (6x faster than advanced indexing on CPU). Head-major
# because a gather then comes out as `[kv_heads, tokens, head_dim]`, already the layout the
# matmuls and SDPA read: with slot-major rows every layer paid two extra copies of the gathered
# keys and values to make them contiguous. Reads and writes go through the cache viewed as
# `[kv_heads * num_slots, head_dim]` rows, with row indices (head * num_slots + slot) built once
# per step: `index_select` along dim 1 of the 3-d cache was 2.3x slower than along dim 0.
def cache_rows(slots: torch.Tensor, kv_heads: int, num_slots: int) -> torch.Tensor:
    """Cache slots `[N]` → rows `[kv_heads * N]` of the `[kv_heads * num_slots, d]` view, head-major."""
    return (torch.arange(kv_heads, dtype=torch.long, device=slots.device)[:, None] * num_slots + slots[None, :]).reshape(-1)


def table_slots(tables: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """Block tables `[B, blocks]` → each row's first `length` cache slots `[B, length]`."""
    offsets = torch.arange(block_size, dtype=torch.long, device=tables.device)
    return (tables[:, :, None] * block_size + offsets).reshape(tables.shape[0], -1)[:, :length]


def padding_bias(lens: torch.Tensor, length: int) -> torch.Tensor:
    """Each row's -inf bias past its own length `lens [B]`, as `[1, B, 1, length]` float32."""
    past = torch.arange(length, device=lens.device)[None, :] >= lens[:, None]
    return torch.zeros(past.shape, dtype=torch.float32, device=lens.device).masked_fill_(past, float("-inf"))[None, :, None, :]


def _slots_of(table: list[int], ctx: int, block_size: int) -> torch.Tensor:
    return table_slots(torch.tensor([table], dtype=torch.long), block_size, ctx)[0]


def _invariant_groups(
    tables: np.ndarray, lens: list[int], block_size: int, kv_heads: int, num_slots: int, device: torch.device
) -> list[DecodeGroup]:
    """Decode sequences grouped by their own length's bucket, each padded to that bucket."""
    buckets: dict[int, list[int]] = {}
    for i, length in enumerate(lens):
        buckets.setdefault(-(-length // INVARIANT_KV_BUCKET) * INVARIANT_KV_BUCKET, []).append(i)
    groups = []
    for padded, members in sorted(buckets.items()):
        slots, bias = _decode_gather(tables[members], np.array([lens[i] for i in members]), block_size, padded)
        rows = torch.from_numpy(_host_cache_rows(slots, kv_heads, num_slots)).to(device)
        groups.append(DecodeGroup(torch.tensor(members, dtype=torch.long, device=device), rows, padded, torch.from_numpy(bias).to(device)))
    return groups


def _decode_gather(tables: np.ndarray, lens: np.ndarray, block_size: int, padded_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's slots `[B, L]` (`tables`: 0-padded `[B, blocks]`), padded to the longest
    (or `padded_len`), and the -inf padding bias `[1, B, 1, L]` (float32), on the host."""
    max_len = padded_len or int(lens.max())
    max_blocks = -(-max_len // block_size)
    if tables.shape[1] < max_blocks:
        tables = np.pad(tables, ((0, 0), (0, max_blocks - tables.shape[1])))
    slots = (tables[:, :max_blocks, None] * block_size + np.arange(block_size)).reshape(len(tables), -1)[:, :max_len]
    bias = np.zeros((len(tables), max_len), dtype=np.float32)
    bias[np.arange(max_len)[None, :] >= lens[:, None]] = -np.inf
    return slots, bias[None, :, None, :]


def _host_cache_rows(slots: np.ndarray, kv_heads: int, num_slots: int) -> np.ndarray:
    """`cache_rows` on the host (numpy's small operations cost a fraction of torch's)."""
    return (np.arange(kv_heads, dtype=np.int64)[:, None] * num_slots + slots.reshape(-1)[None, :]).reshape(-1)
