"""The row-invariant kernels (build.py) as torch functions: weights packed for them, and calls.

Owns: `Packed` (a linear's weight in the kernels' 16-column blocks: dense bf16, or a GGUF
checkpoint's own Q4_1 / Q8_0 blocks), the packers, `RowStep` (a step's rows: positions,
cache slots, which sequence and block table each reads) and one function per kernel. Every
tensor handed over is contiguous on the CPU; outputs are allocated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from actors.runners.native.kernels import build
from actors.runners.step_index import StepIndex

BF16, Q4_1, Q8_0 = 0, 1, 2
GROUP = 32  # input columns a Q4_1 / Q8_0 block scales together
DENSE_ROWS = 16
HEAD_CHUNKS = (1, 2, 4, 6, 8, 16)  # head_dim / 16 values the attention kernel has registers for


def unsupported(hidden: int, intermediate: int, head_dim: int, heads: int, kv_heads: int) -> str | None:
    """Why the kernels cannot run a decoder of these shapes (None: they can)."""
    if head_dim % 16 or head_dim // 16 not in HEAD_CHUNKS:
        return f"head_dim {head_dim} (the attention kernel takes {', '.join(str(16 * c) for c in HEAD_CHUNKS)})"
    if heads % kv_heads or heads // kv_heads > 64:
        return f"{heads} heads over {kv_heads} kv heads"
    if hidden % 2 or intermediate % 2 or (heads * head_dim) % 2:
        return "an odd matrix width"
    return None


@dataclass(slots=True)
class Packed:
    data: torch.Tensor  # uint8: [N / 16] blocks of the format's layout (rowwise's common.h)
    fmt: int
    n: int
    k: int
    bias: torch.Tensor | None = None  # float32 [N]
    swiglu: bool = False  # (gate, up) blocks interleaved: the product is silu(gate) * up [N / 2]
    # The same weights as bf16 pairs (the blocks' exact upcast, rounded as the kernel rounds its
    # dequantized weights), read instead of the blocks by calls of DENSE_ROWS rows or more:
    # there the products are compute-bound and the dequantizing cost ~20% (same bits either way).
    dense: Packed | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.k


def as_swiglu(w: Packed) -> Packed:
    """A fused [gate; up] matrix (I rows each, I % 16 == 0) with its 16-column blocks interleaved
    gate 0, up 0, gate 1, ...: the product then comes out as silu(gate) * up, in one call."""
    blocks = w.data.view(w.n // 16, -1)
    half = w.n // 32
    order = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)
    return Packed(blocks[order].contiguous().reshape(-1), w.fmt, w.n, w.k, None, swiglu=True, dense=as_swiglu(w.dense) if w.dense else None)


def _blocks(t: torch.Tensor) -> torch.Tensor:
    """Rows padded with zeros to a multiple of 16."""
    pad = -t.shape[0] % 16
    return torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t


def pack_dense(w: torch.Tensor, bias: torch.Tensor | None = None) -> Packed:
    """A dense [N, K] matrix, rounded to bf16, as 16-column blocks of input-column pairs."""
    n, k = w.shape
    blocks = _blocks(w.to(torch.bfloat16)).reshape(-1, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()
    return Packed(blocks.view(torch.uint8).reshape(-1), BF16, n, k, _bias(bias))


def pack_q4_1(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, bias: torch.Tensor | None = None) -> Packed:
    """Q4_1 blocks (w = d q + m): quants q [N, K] in 0..15, d and m [N, K / 32], kept exactly."""
    n, k = q.shape
    g = k // GROUP
    q = _blocks(q.to(torch.uint8)).reshape(-1, 16, g, 16, 2).permute(0, 2, 3, 1, 4)  # [NB, G, pair, lane, even|odd]
    qs = (q[..., 0] | (q[..., 1] << 4)).reshape(-1, g, 256)
    return Packed(torch.cat([qs, _scales(d, g), _scales(m, g)], dim=-1).contiguous().reshape(-1), Q4_1, n, k, _bias(bias))


def pack_q8_0(q: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None = None) -> Packed:
    """Q8_0 blocks (w = d q): quants q [N, K] int8, d [N, K / 32], kept exactly."""
    n, k = q.shape
    g = k // GROUP
    qs = _blocks(q.to(torch.int8)).reshape(-1, 16, g, 16, 2).permute(0, 2, 3, 4, 1).contiguous().view(torch.uint8)  # [NB, G, pair, even|odd, lane]
    return Packed(torch.cat([qs.reshape(-1, g, 512), _scales(d, g)], dim=-1).contiguous().reshape(-1), Q8_0, n, k, _bias(bias))


def _scales(s: torch.Tensor, g: int) -> torch.Tensor:
    """Per-block scales [N, G] as fp16 bytes [NB, G, 32] (16 lanes each)."""
    return _blocks(s.to(torch.float16)).reshape(-1, 16, g).permute(0, 2, 1).contiguous().view(torch.uint8)


class Stack:
    """A decoder's layers as one `sy_stack` call (stack.c): each layer's norms (Qwen3's q/k norms
    too), weights, biases and cache as the per-layer calls pass them, written once (the caches'
    addresses once per cache). `of` gives None for a decoder whose gate_up is not a SwiGLU pair
    (or of other shapes): rowwise.py then calls layer by layer."""

    FIELDS = 22

    def __init__(self, layers: list[Any], hidden: int, q_size: int, dense: bool) -> None:
        self.layers, self.hidden, self.q_size = layers, hidden, q_size
        self.table = np.zeros((len(layers), self.FIELDS), dtype=np.int64)
        for row, layer in zip(self.table, layers):
            for at, w in ((1, layer.qkv), (5, layer.o_proj), (10, layer.gate_up), (14, layer.down)):
                w = w.dense if dense and w.dense is not None else w
                row[at : at + 4] = (w.data.data_ptr(), w.fmt, w.n, _ptr(w.bias) or 0)
            row[0], row[9] = layer.input_norm.data_ptr(), layer.post_norm.data_ptr()
            if layer.q_norm is not None:
                row[20], row[21] = layer.q_norm.data_ptr(), layer.k_norm.data_ptr()
        self._cache: int | None = None

    @classmethod
    def of(cls, layers: list[Any], hidden: int, q_size: int, dense: bool) -> "Stack | None":
        for layer in layers:
            if (layer.q_norm is None) != (layer.k_norm is None) or not layer.gate_up.swiglu or layer.qkv.k != hidden or layer.o_proj.k != q_size or layer.down.k != layer.gate_up.n // 2:
                return None
        return cls(layers, hidden, q_size, dense)

    def __call__(
        self, h: torch.Tensor, step: RowStep, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor, k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor], eps: float, scale: float, window: int,
    ) -> None:  # fmt: skip
        """Every layer over the residual stream `h` [T, hidden] (bf16, contiguous), in place."""
        if self._cache != k_cache[0].data_ptr():
            self.table[:, 18] = [k.data_ptr() for k in k_cache]
            self.table[:, 19] = [v.data_ptr() for v in v_cache]
            self._cache = k_cache[0].data_ptr()
        t, layer = h.shape[0], self.layers[0]
        qkv = torch.empty(t, layer.qkv.n, dtype=torch.bfloat16)
        attn = torch.empty(t, self.q_size, dtype=torch.bfloat16)
        mlp = torch.empty(t, layer.gate_up.n // 2, dtype=torch.bfloat16)
        head_dim = k_cache[0].shape[-1]
        _lib().sy_stack(
            h.data_ptr(), t, self.hidden, len(self.layers), self.table.ctypes.data, eps, heads, kv_heads, head_dim, cos.data_ptr(), sin.data_ptr(),
            step.positions.data_ptr(), step.slots.data_ptr(), k_cache[0].shape[1], step.tables.data_ptr(), step.tables.shape[1], step.block_size,
            step.row_seq.data_ptr(), window, scale, qkv.data_ptr(), attn.data_ptr(), mlp.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip


def _lib() -> Any:
    return build._loaded or build.library()


def _bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.float().contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def linear(
    x: torch.Tensor, w: Packed, out_f32: bool = False, residual: torch.Tensor | None = None, norm: torch.Tensor | None = None, eps: float = 0.0
) -> torch.Tensor:
    """x [M, K] bf16 (rows contiguous), through RMSNorm(`norm`, `eps`) first when given, times
    w^T plus its bias: bf16 (or fp32) [M, N], [M, N / 2] for a SwiGLU pair. With `residual`
    [M, N] the sum residual + x w^T, written into `residual` itself."""
    if x.stride(-1) != 1 or (norm is not None and not x.is_contiguous()):
        x = x.contiguous()
    if w.dense is not None and x.shape[0] >= DENSE_ROWS:
        w = w.dense
    width = w.n // 2 if w.swiglu else w.n
    y = residual if residual is not None else torch.empty(x.shape[0], width, dtype=torch.float32 if out_f32 else torch.bfloat16)
    _lib().sy_linear(
        x.data_ptr(), x.shape[0], w.k, x.stride(0), _ptr(norm), eps, w.data.data_ptr(), w.fmt, w.n, _ptr(w.bias), int(w.swiglu),
        _ptr(residual), y.stride(0), y.data_ptr(), int(out_f32), y.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    return y


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(rows)
    _lib().sy_rmsnorm(rows.data_ptr(), rows.shape[0], rows.shape[1], rows.stride(0), weight.data_ptr(), eps, y.data_ptr(), rows.shape[1], torch.get_num_threads())
    return y.view(x.shape)


def lora_add(x: torch.Tensor, slots: torch.Tensor, a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, order: torch.Tensor | None = None) -> None:
    """y [T, N] bf16 += (x [T, K] A_s^T) B_s^T for each row's adapter s = slots [T] (int32, 0:
    none), A [S, R, K] and B^T [S, R, N] bf16 (lora.c says in which order). `order`: the rows
    with an adapter grouped by adapter (int32; `adapter_order` of `slots` when not given)."""
    assert x.stride(-1) == 1 and y.stride(-1) == 1 and a.is_contiguous() and b.is_contiguous() and slots.dtype == torch.int32 and a.dtype == b.dtype == torch.bfloat16
    order = adapter_order(slots.tolist()) if order is None else order
    _lib().sy_lora_add(
        x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), slots.data_ptr(), order.data_ptr(), order.shape[0], a.data_ptr(), b.data_ptr(), a.shape[1],
        b.shape[2], y.data_ptr(), y.stride(0), torch.get_num_threads(),
    )  # fmt: skip


def adapter_order(slots: list[int]) -> torch.Tensor:
    """The rows with an adapter (slot > 0), grouped by adapter, as int32."""
    return torch.tensor(sorted((t for t, s in enumerate(slots) if s > 0), key=lambda t: slots[t]), dtype=torch.int32)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[M, 2I] (gate, then up) → silu(gate) * up [M, I]."""
    m, width = gate_up.shape
    y = torch.empty(m, width // 2, dtype=torch.bfloat16)
    _lib().sy_silu_mul(gate_up.contiguous().data_ptr(), m, width // 2, y.data_ptr(), torch.get_num_threads())
    return y


@dataclass(slots=True)
class RowStep:
    """A packed step's rows as the kernels read them."""

    positions: torch.Tensor  # int64 [T]
    slots: torch.Tensor  # int64 [T] cache slot of each row's new key and value
    row_seq: torch.Tensor  # int32 [T] which block table each row reads
    row_pos: torch.Tensor  # int32 [T] (its keys are its sequence's positions 0..row_pos)
    tables: torch.Tensor  # int32 [S, max blocks], 0-padded
    block_size: int

    @classmethod
    def build(cls, seqs: list[tuple[int, int]], tables: list[list[int]], block_size: int) -> "RowStep":
        index = StepIndex.of(seqs, tables, block_size)
        positions = torch.from_numpy(index.positions)
        return cls(
            positions, torch.from_numpy(index.slots), torch.from_numpy(index.seq_of.astype(np.int32)), positions.to(torch.int32),
            torch.from_numpy(index.tables.astype(np.int32)), block_size,
        )  # fmt: skip


def rope_write(qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor, step: RowStep, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Rotary on q and k of each row of qkv [T, (H + 2 KVH) d]; k and v into the cache at the
    rows' slots; the rotated q [T, H, d]."""
    t = qkv.shape[0]
    head_dim = k_cache.shape[-1]
    q = torch.empty(t, heads, head_dim, dtype=torch.bfloat16)
    _lib().sy_rope_write(
        qkv.data_ptr(), t, qkv.stride(0), heads, kv_heads, head_dim, cos.data_ptr(), sin.data_ptr(), step.positions.data_ptr(), step.slots.data_ptr(),
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[1], torch.get_num_threads(),
    )  # fmt: skip
    return q


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step: RowStep, scale: float, window: int = 0) -> torch.Tensor:
    """q [T, H, d] → each row's attention over its own sequence's cached keys [T, H, d]."""
    t, heads, head_dim = q.shape
    out = torch.empty_like(q)
    _lib().sy_attention(
        q.data_ptr(), t, heads, k_cache.shape[0], head_dim, k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[1],
        step.tables.data_ptr(), step.tables.shape[1], step.block_size, step.row_seq.data_ptr(), step.row_pos.data_ptr(),
        window, scale, out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out


def rope_attention(
    qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor, step: RowStep, k_cache: torch.Tensor, v_cache: torch.Tensor,
    scale: float, window: int = 0,
) -> torch.Tensor:  # fmt: skip
    """`rope_write` then `attention`, in one call: a layer's attention output [T, H, d]."""
    t = qkv.shape[0]
    head_dim = k_cache.shape[-1]
    out = torch.empty(t, heads, head_dim, dtype=torch.bfloat16)
    _lib().sy_rope_attention(
        qkv.data_ptr(), t, qkv.stride(0), heads, kv_heads, head_dim, cos.data_ptr(), sin.data_ptr(), step.positions.data_ptr(), step.slots.data_ptr(),
        k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[1], step.tables.data_ptr(), step.tables.shape[1], step.block_size, step.row_seq.data_ptr(),
        window, scale, out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out
