"""Batched sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

Owns: turning a step's logits `[S, V]` into one token per row with tensor operations over the
whole batch, never a Python loop per request.

Seeds without per-request generators: each row's randomness is a counter-based hash of
(seed, position, token id) — murmur3's 32-bit finalizer over int64 tensors — turned into
Gumbel noise. A request's sample therefore depends only on its own seed, the position it is
generating and its logits, never on which other requests share the step, which is what makes
"same seed, same text, alone or beside 31 others" hold. Requests without a seed get one drawn
at admission.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


@dataclass(slots=True)
class SamplingBatch:
    temperature: torch.Tensor  # [S] float32; 0 = greedy
    top_k: torch.Tensor  # [S] int64; 0 = off
    top_p: torch.Tensor  # [S] float32; 1 = off
    seed: torch.Tensor  # [S] int64
    position: torch.Tensor  # [S] int64, the index of the token being generated
    all_greedy: bool
    any_filter: bool

    @classmethod
    def build(cls, rows: list[tuple[float, int, float, int, int]], device: torch.device) -> "SamplingBatch":
        temps = [r[0] for r in rows]
        top_ks = [r[1] for r in rows]
        top_ps = [r[2] for r in rows]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_ks, dtype=torch.long, device=device),
            top_p=torch.tensor(top_ps, dtype=torch.float32, device=device),
            seed=torch.tensor([r[3] & 0x7FFFFFFFFFFFFFFF for r in rows], dtype=torch.long, device=device),
            position=torch.tensor([r[4] for r in rows], dtype=torch.long, device=device),
            all_greedy=all(t == 0.0 or k == 1 for t, k in zip(temps, top_ks)),
            any_filter=any(k > 1 for k in top_ks) or any(p < 1.0 for p in top_ps),
        )


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def hashed_uniform(seed: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform (0, 1) noise `[S, V]`, a pure function of (seed, position, token id)."""
    row = _fmix32(_fmix32(seed) ^ _fmix32(seed >> 32) * 0x27D4EB2F ^ _fmix32(position + 0x165667B1))
    cols = torch.arange(vocab_size, device=seed.device, dtype=torch.long)
    x = _fmix32(row[:, None] * 0x9E3779B1 + cols[None, :] * 0x85EBCA77 + 0x2545F491)
    # 23 random bits plus one half: k + 0.5 < 2**23 needs exactly float32's 24-bit significand,
    # so u is never rounded up to 1.0 (with 24 bits, k = 2**24 - 1 rounded to 1.0, u = 1 made
    # the Gumbel noise +inf and that token won whatever its logit, even a masked one).
    return ((x >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """logits `[S, V]` (any float dtype) → token ids `[S]`."""
    logits = logits.float()
    greedy_tokens = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy_tokens
    is_greedy = (batch.temperature == 0.0) | (batch.top_k == 1)
    temperature = torch.where(is_greedy, torch.ones_like(batch.temperature), batch.temperature)
    scaled = logits / temperature[:, None]
    if batch.any_filter:
        scaled = _apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
    noise = hashed_uniform(batch.seed, batch.position, logits.shape[-1])
    gumbel = -torch.log(-torch.log(noise))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(is_greedy, greedy_tokens, sampled)


def _apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    drop = ranks >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # Drop a token when the mass strictly before it already reaches top_p; the first always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)  # rounding must not cut a top_p=1 row
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's packed int32 masks `[R, ceil(V/32)]` → allowed-token booleans `[R, V]`."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_penalties(
    logits: torch.Tensor,
    histories: list[tuple[list[int], int]],
    presence: list[float],
    frequency: list[float],
    repetition: list[float],
) -> torch.Tensor:
    """Presence, frequency (OpenAI) and repetition (CTRL/HF) penalties for every row at once.

    `histories` holds, per row, (prompt + output token ids, number of prompt tokens). Presence
    and frequency count output tokens only; repetition covers prompt and output, as vLLM and
    transformers define it. Counting is one bincount over the whole batch.
    """
    rows, vocab = logits.shape
    device = logits.device
    out_flat: list[int] = []
    all_flat: list[int] = []
    for r, (tokens, num_prompt) in enumerate(histories):
        base = r * vocab
        out_flat.extend(base + t for t in tokens[num_prompt:])
        all_flat.extend(base + t for t in tokens)
    size = rows * vocab
    out_counts = torch.bincount(torch.tensor(out_flat, dtype=torch.long), minlength=size).view(rows, vocab).to(device)
    seen = torch.bincount(torch.tensor(all_flat, dtype=torch.long), minlength=size).view(rows, vocab).to(device) > 0
    presence_t = torch.tensor(presence, dtype=logits.dtype, device=device)[:, None]
    frequency_t = torch.tensor(frequency, dtype=logits.dtype, device=device)[:, None]
    repetition_t = torch.tensor(repetition, dtype=logits.dtype, device=device)[:, None]
    # Repetition first, then presence and frequency: vLLM's order.
    penalized = torch.where(logits > 0, logits / repetition_t, logits * repetition_t)
    logits = torch.where(seen, penalized, logits)
    return logits - presence_t * (out_counts > 0).to(logits.dtype) - frequency_t * out_counts.to(logits.dtype)


def top_logprobs(logprobs: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    if k <= 0:
        return [[] for _ in range(logprobs.shape[0])], [[] for _ in range(logprobs.shape[0])]
    values, ids = logprobs.topk(k, dim=-1)
    return ids.tolist(), values.tolist()
