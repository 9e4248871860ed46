"""The row-invariant kernels (actors/runners/native/kernels): right, and the same bits for a row
whatever else the call holds.

Each kernel is checked against a float64 (or SDPA float32) reference within bf16's rounding, and
for invariance: a row's output is bit-identical computed alone, among 1..70 rows, in any subset;
a prompt's attention equals the same positions decoded one at a time and chunked beside another
sequence. On a CPU with AVX512-BF16 the plain C build (`-march=x86-64-v3`) must give the same
bits as the vector build, so replicas on CPUs with and without it agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from actors.runners.native.kernels import build, ops
from tests.support.device import needs_kernels

pytestmark = needs_kernels()


def _weights(fmt: int, n: int, k: int, seed: int = 0) -> tuple[ops.Packed, torch.Tensor]:
    """A packed matrix of `fmt` and its dense value (the weights the format carries exactly)."""
    g = torch.Generator().manual_seed(seed)
    if fmt == ops.BF16:
        w = (torch.randn(n, k, generator=g) * 0.05).bfloat16().float()
        return ops.pack_dense(w), w
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 0.001).half()
    if fmt == ops.Q4_1:
        q = torch.randint(0, 16, (n, k), generator=g)
        m = (-torch.rand(n, k // 32, generator=g) * 0.08).half()
        return ops.pack_q4_1(q, d, m), q.float() * d.float().repeat_interleave(32, 1) + m.float().repeat_interleave(32, 1)
    q = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    return ops.pack_q8_0(q, d), q.float() * d.float().repeat_interleave(32, 1)


FORMATS = [ops.BF16, ops.Q4_1, ops.Q8_0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_product_row_is_the_same_bits_whatever_rows_share_the_call(fmt: int) -> None:
    torch.manual_seed(0)
    packed, dense = _weights(fmt, 200, 96)
    x = torch.randn(70, 96).bfloat16()
    whole = ops.linear(x, packed, out_f32=True)
    reference = x.double() @ dense.bfloat16().double().t()  # the format's weights as bf16, summed exactly
    assert torch.allclose(whole.double(), reference, rtol=1e-5, atol=1e-4)
    for rows in (1, 2, 3, 4, 5, 8, 17, 33, 69):
        assert torch.equal(ops.linear(x[:rows], packed, out_f32=True), whole[:rows]), rows
    picked = [3, 61, 7, 40, 41]
    assert torch.equal(ops.linear(x[picked], packed, out_f32=True), whole[picked])
    assert torch.equal(ops.linear(x[5:6], packed, out_f32=True), whole[5:6])


def test_quantized_blocks_multiply_exactly_as_their_dense_bf16_upcast() -> None:
    x = torch.randn(9, 64).bfloat16()
    for fmt in (ops.Q4_1, ops.Q8_0):
        packed, dense = _weights(fmt, 48, 64, seed=fmt)
        assert torch.equal(ops.linear(x, packed, out_f32=True), ops.linear(x, ops.pack_dense(dense), out_f32=True))


def test_the_fused_epilogues_round_as_the_eager_model_does() -> None:
    torch.manual_seed(1)
    x = torch.randn(7, 64).bfloat16()
    gate_up, dense = _weights(ops.BF16, 192, 64)
    plain = ops.linear(x, gate_up)
    fused = ops.linear(x, ops.as_swiglu(gate_up))
    assert torch.equal(fused, ops.silu_mul(plain))
    assert (fused.float() - (F.silu(plain[:, :96]) * plain[:, 96:]).float()).abs().max() <= 2 ** -6 * fused.float().abs().max()
    bias = torch.randn(100)
    w = ops.pack_dense(dense[:100], bias)
    residual = torch.randn(7, 100).bfloat16()
    expected = residual + ops.linear(x, w)
    assert torch.equal(ops.linear(x, w, residual=residual), expected) and torch.equal(residual, expected)  # written in place
    norm = torch.randn(64).bfloat16()
    assert torch.equal(ops.linear(x, w, norm=norm, eps=1e-5), ops.linear(ops.rmsnorm(x, norm, 1e-5), w))  # the RMSNorm prologue
    assert torch.allclose(ops.linear(x, w, out_f32=True).double(), x.double() @ dense[:100].double().t() + bias.double(), atol=1e-4)


def test_rmsnorm_and_swiglu_match_transformers_rounding_row_by_row() -> None:
    x, w = torch.randn(33, 576).bfloat16(), torch.randn(576).bfloat16()
    h = x.float()
    expected = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    got = ops.rmsnorm(x, w, 1e-5)
    assert (got.float() - expected.float()).abs().max() <= 2 ** -7 * expected.float().abs().max()
    assert all(torch.equal(ops.rmsnorm(x[i : i + 1], w, 1e-5), got[i : i + 1]) for i in range(33))
    gu = torch.randn(33, 256).bfloat16()
    act = ops.silu_mul(gu)
    assert all(torch.equal(ops.silu_mul(gu[i : i + 1]), act[i : i + 1]) for i in range(33))


class Cache:
    """A paged cache of two sequences (block size 4) and the kernels' view of a step over it."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        self.h, self.kvh, self.d = heads, kv_heads, head_dim
        self.k = torch.zeros(kv_heads, 256, head_dim, dtype=torch.bfloat16)
        self.v = torch.zeros_like(self.k)
        self.tables = [list(range(20, 40)), [3, 1, 60, 7, 8, 9, 10, 11, 12, 13, 14, 15]]  # out of order, as a cache hands them out
        g = torch.Generator().manual_seed(head_dim)
        self.cos, self.sin = torch.randn(128, head_dim, generator=g), torch.randn(128, head_dim, generator=g)

    def step(self, seqs: list[tuple[int, int]], qkv: torch.Tensor, window: int = 0, fused: bool = False) -> torch.Tensor:
        rows = ops.RowStep.build(seqs, self.tables[: len(seqs)], 4)
        if fused:
            return ops.rope_attention(qkv, self.h, self.kvh, self.cos, self.sin, rows, self.k, self.v, self.d**-0.5, window)
        q = ops.rope_write(qkv, self.h, self.kvh, self.cos, self.sin, rows, self.k, self.v)
        return ops.attention(q, self.k, self.v, rows, self.d**-0.5, window)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 16), (9, 3, 64), (7, 1, 128), (8, 8, 32)])
def test_a_prompt_attends_as_its_positions_decoded_one_by_one_or_chunked_beside_another(heads: int, kv_heads: int, head_dim: int) -> None:
    torch.manual_seed(2)
    n = 37
    width = (heads + 2 * kv_heads) * head_dim
    qkv, other = torch.randn(n, width).bfloat16(), torch.randn(n, width).bfloat16()
    whole = Cache(heads, kv_heads, head_dim)
    prompt = whole.step([(0, n)], qkv)
    one = Cache(heads, kv_heads, head_dim)
    assert torch.equal(torch.cat([one.step([(p, 1)], qkv[p : p + 1], fused=p % 2 == 0) for p in range(n)]), prompt)  # rope + attention in one call or two
    chunked, outs = Cache(heads, kv_heads, head_dim), []
    for start in range(0, n, 6):
        size = min(6, n - start)
        outs.append(chunked.step([(start, size), (start, 3)], torch.cat([qkv[start : start + size], other[start : start + 3]]))[:size])
    assert torch.equal(torch.cat(outs), prompt)
    q = F.scaled_dot_product_attention  # the reference: float32 SDPA over the same cached keys
    keys = torch.cat([whole.k[:, b * 4 : b * 4 + 4] for b in whole.tables[0]], dim=1)[:, :n].float()
    values = torch.cat([whole.v[:, b * 4 : b * 4 + 4] for b in whole.tables[0]], dim=1)[:, :n].float()
    rotated = _rotated_q(qkv, whole)
    group = heads // kv_heads
    expected = q(rotated, keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0), is_causal=True).transpose(0, 1)
    assert (prompt.float() - expected).abs().max() < 0.02
    windowed = Cache(heads, kv_heads, head_dim)
    last = windowed.step([(0, n)], qkv, window=8)[-1:]
    expected = q(rotated[:, -1:], keys[:, -8:].repeat_interleave(group, 0), values[:, -8:].repeat_interleave(group, 0)).transpose(0, 1)
    assert (last.float() - expected).abs().max() < 0.02


def _rotated_q(qkv: torch.Tensor, cache: Cache) -> torch.Tensor:
    """The step's q after rotary, as the kernel computes it (float32, one rounding), [H, T, d]."""
    n, d, half = qkv.shape[0], cache.d, cache.d // 2
    q = qkv[:, : cache.h * d].float().view(n, cache.h, d)
    rotated = torch.cat([-q[..., half:], q[..., :half]], dim=-1)
    return (q * cache.cos[:n, None] + rotated * cache.sin[:n, None]).bfloat16().float().transpose(0, 1)


def _has_avx512_bf16() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" in flags


@pytest.mark.skipif(not _has_avx512_bf16(), reason="this CPU runs the plain C loops already")
def test_the_plain_c_build_gives_the_vector_builds_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(3)
    x = torch.randn(9, 96).bfloat16()
    qkv = torch.randn(21, (9 + 6) * 64).bfloat16()
    gu = torch.randn(5, 256).bfloat16()
    lora_a, lora_b = torch.randn(2, 7, 90).bfloat16(), torch.randn(2, 7, 80).bfloat16()

    def everything() -> list[torch.Tensor]:
        out = [ops.linear(x, _weights(fmt, 80, 96, seed=fmt)[0], out_f32=True) for fmt in FORMATS]
        out.append(ops.linear(x, ops.as_swiglu(_weights(ops.BF16, 64, 96)[0])))
        out += [Cache(9, 3, 64).step([(0, 21)], qkv), ops.silu_mul(gu), ops.rmsnorm(gu, gu[0].contiguous(), 1e-6)]
        tuned = gu[:, :80].clone()  # LoRA: rows of two adapters and the base, odd widths for the tails
        ops.lora_add(x[:5, :90], torch.tensor([1, 0, 2, 2, 1], dtype=torch.int32), lora_a, lora_b, tuned)
        return [*out, tuned]

    vector = everything()
    monkeypatch.setattr(build, "_loaded", build.load("x86-64-v3"))
    for got, want in zip(everything(), vector):
        assert torch.equal(got, want)


def test_lora_add_adds_each_rows_own_adapter_once_rounded() -> None:
    """ops.lora_add: each row gets its own adapter's (x A^T) B^T added and rounded to bf16 once;
    the base's rows (slot 0) are left as they were; a row's result is the same bits alone."""
    torch.manual_seed(4)
    x, y = torch.randn(6, 100).bfloat16(), torch.randn(6, 70).bfloat16()
    a, b = (torch.randn(3, 9, 100) * 0.1).bfloat16(), (torch.randn(3, 9, 70) * 0.1).bfloat16()
    slots = torch.tensor([0, 1, 2, 3, 0, 2], dtype=torch.int32)
    out = y.clone()
    ops.lora_add(x, slots, a, b, out)
    for t, s in enumerate(slots.tolist()):
        if s == 0:
            assert torch.equal(out[t], y[t])
            continue
        want = (y[t].float() + (x[t].float() @ a[s - 1].float().T) @ b[s - 1].float()).bfloat16()
        assert (out[t].float() - want.float()).abs().max() <= 2**-7 * want.float().abs().max()
        alone = y[t : t + 1].clone()
        ops.lora_add(x[t : t + 1], slots[t : t + 1], a, b, alone)
        assert torch.equal(alone[0], out[t])
