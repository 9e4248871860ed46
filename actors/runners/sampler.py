"""Batched sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

Owns: turning a step's logits `[S, V]` into one token per row with tensor operations over the
whole batch, never a Python loop per request.

Seeds without per-request generators: each row draws one uniform number from a counter-based
hash of (seed, position) — murmur3's 32-bit finalizer over int64 tensors — and samples by
inverting its row's cumulative distribution (softmax, cumsum, searchsorted; every op works
row by row). A request's sample therefore depends only on its own seed, the position it is
generating and its logits, never on which other requests share the step, which is what makes
"same seed, same text, alone or beside 31 others" hold. Requests without a seed get one drawn
at admission.

Why inverse CDF and not Gumbel-max: Gumbel noise needs a hashed number per (row, token), ~15
int64 passes over `[S, V]`; at batch 32 with a 49k vocabulary that was 27 ms of a 97 ms CPU
step. One number per row plus softmax and cumsum costs a few float32 passes.
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
    unit_temperature: bool = False  # every row samples at temperature 1 or is greedy

    @classmethod
    def build(cls, rows: list[tuple[float, int, float, int, int]], device: torch.device) -> "SamplingBatch":
        """The rows' parameters; an all-greedy batch (the argmax alone) gets no tensors."""
        temps = [r[0] for r in rows]
        top_ks = [r[1] for r in rows]
        if all(t == 0.0 or k == 1 for t, k in zip(temps, top_ks)):
            return cls(*(_NONE,) * 5, all_greedy=True, any_filter=False, unit_temperature=True)
        top_ps = [r[2] for r in rows]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_ks, dtype=torch.long, device=device),
            top_p=torch.tensor(top_ps, dtype=torch.float32, device=device),
            seed=torch.tensor([r[3] & 0x7FFFFFFFFFFFFFFF for r in rows], dtype=torch.long, device=device),
            position=torch.tensor([r[4] for r in rows], dtype=torch.long, device=device),
            all_greedy=False,
            any_filter=any(k > 1 for k in top_ks) or any(p < 1.0 for p in top_ps),
            unit_temperature=all(t in (0.0, 1.0) or k == 1 for t, k in zip(temps, top_ks)),
        )


_NONE = torch.empty(0)  # an all-greedy batch's parameters: never read


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def hashed_uniform(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Uniform (0, 1) numbers `[S]`, a pure function of each row's (seed, position)."""
    row = _fmix32(_fmix32(seed) ^ _fmix32(seed >> 32) * 0x27D4EB2F ^ _fmix32(position + 0x165667B1))
    x = _fmix32(row * 0x9E3779B1 + 0x2545F491)
    # 23 random bits plus one half: k + 0.5 < 2**23 needs exactly float32's 24-bit significand,
    # so u is never rounded to 0 or up to 1.0.
    return ((x >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def argmax(logits: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Each row's first largest entry, as `argmax(dim=-1)` gives it, in a fraction of its time on
    a CPU (torch's CPU argmax reduces one element at a time: 2.7 ms for [64, 49152] float32 on
    one Zen 4 thread, against 0.3 ms here): each `chunk` of a row reduced to its largest value
    (vectorized), the first chunk holding the row's largest, then the first entry of it equal
    to it. Row by row, so a row's answer never depends on its neighbours."""
    rows, vocab = logits.shape
    whole = vocab - vocab % chunk
    if logits.device.type != "cpu" or vocab < 16 * chunk or logits.stride(-1) != 1:
        return logits.argmax(dim=-1)
    chunks = logits[:, :whole].unflatten(-1, (whole // chunk, chunk))
    best = chunks.amax(dim=-1)
    if whole < vocab:
        best = torch.cat([best, logits[:, whole:].amax(dim=-1, keepdim=True)], dim=-1)
    where = best.argmax(dim=-1)  # the first chunk holding the row's largest value
    starts = where * chunk
    window = torch.arange(chunk, device=logits.device)[None, :] + starts[:, None]
    inside = logits.gather(1, window.clamp_(max=vocab - 1)).argmax(dim=-1)
    return starts + inside


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """logits `[S, V]` (any float dtype) → token ids `[S]`."""
    logits = logits.float()
    greedy_tokens = argmax(logits)
    if batch.all_greedy:
        return greedy_tokens
    is_greedy = (batch.temperature == 0.0) | (batch.top_k == 1)
    if batch.unit_temperature:  # every row at temperature 1 (or greedy): the logits as they are, no pass over them
        scaled = logits
    else:
        temperature = torch.where(is_greedy, torch.ones_like(batch.temperature), batch.temperature)
        scaled = logits / temperature[:, None]
    if batch.any_filter:
        scaled = _apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
    cdf = scaled.softmax(dim=-1).cumsum(dim=-1)
    # The first token whose cumulative probability reaches u * total. With 0 < u < 1 the
    # target is above 0 and at most the total, so the chosen token's own probability
    # (cdf[i] - cdf[i - 1]) is positive: a masked (-inf) or filtered token is never drawn.
    target = hashed_uniform(batch.seed, batch.position) * cdf[:, -1]
    sampled = torch.searchsorted(cdf, target[:, None]).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    return torch.where(is_greedy, greedy_tokens, sampled)


# Top-k / top-p look at each row's best `_CANDIDATES` tokens only (a partial sort), falling back
# to a full sort for a row whose kept set could reach past them (on real text at temperature 1,
# 2048 tokens hold 90% of the mass at nearly every position). A full sort of a 49k vocabulary
# at batch 32 was 42-55 ms of a 70 ms CPU step; the candidates' topk is a few ms. The width is a
# constant, not derived from the batch, so a row's result never depends on its neighbours.
_CANDIDATES = 2048


def _apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """-inf for every token top-k and top-p drop (top-k first, then top-p over what is left)."""
    vocab = logits.shape[-1]
    width = min(vocab, _CANDIDATES)
    values, ids = logits.topk(width, dim=-1)  # sorted, best first
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    keep, last_is_kept = _kept(values, logits, k, top_p)
    out = torch.full_like(logits, float("-inf")).scatter_(-1, ids, values.masked_fill(~keep, float("-inf")))
    unfiltered = (top_k == 0) & (top_p >= 1.0)
    # A full sort is the exact answer when the row's limits reach past the candidates: every
    # candidate kept, or a top-k between the width and the vocabulary (top-p then needs the
    # top-k set's total, which the candidates alone underestimate; with top-k off the total is
    # the whole row's, which _kept has).
    overflow = ~unfiltered & (k > width) & (last_is_kept | (k < vocab))
    if bool(overflow.any()):
        rows = overflow.nonzero().squeeze(-1)
        out[rows] = _filter_sorted(logits[rows], k[rows], top_p[rows])
    return torch.where(unfiltered[:, None], logits, out)


def _kept(values: torch.Tensor, logits: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of the sorted `values` survive; and whether the last one does."""
    ranks = torch.arange(values.shape[-1], device=values.device)[None, :]
    in_k = ranks < k[:, None]
    values_k = values.masked_fill(~in_k, float("-inf"))
    # Normalise over the row's top-k set; with top-k off that is the whole vocabulary.
    log_total = torch.where(k < logits.shape[-1], values_k.logsumexp(dim=-1), logits.logsumexp(dim=-1))
    probs = (values_k - log_total[:, None]).exp()
    # Drop a token when the mass strictly before it already reaches top_p; the first always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    keep = in_k & ~((mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0))  # rounding must not cut a top_p=1 row
    keep[:, 0] = True
    return keep, keep[:, -1]


def _filter_sorted(logits: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    keep, _ = _kept(sorted_logits, logits, k, top_p)
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(~keep, float("-inf")))


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
    transformers define it. The histories go to the device once as one padded id tensor (the
    list-to-tensor conversion is torch's, in C); counting is a scatter_add there, so no Python
    loop touches a token and no `[rows, vocab]` tensor crosses from the host.
    """
    rows, vocab = logits.shape
    device = logits.device
    ids = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(tokens, dtype=torch.long) for tokens, _ in histories], batch_first=True, padding_value=vocab
    ).to(device)  # padding counts into an extra column, dropped below
    num_prompt = torch.tensor([n for _, n in histories], dtype=torch.long, device=device)
    is_output = torch.arange(ids.shape[1], device=device)[None, :] >= num_prompt[:, None]
    ones = torch.ones_like(ids, dtype=logits.dtype)
    seen = torch.zeros(rows, vocab + 1, dtype=logits.dtype, device=device).scatter_add_(1, ids, ones)[:, :vocab] > 0
    out_ids = ids.masked_fill(~is_output, vocab)
    out_counts = torch.zeros(rows, vocab + 1, dtype=logits.dtype, device=device).scatter_add_(1, out_ids, ones)[:, :vocab]
    presence_t = torch.tensor(presence, dtype=logits.dtype, device=device)[:, None]
    frequency_t = torch.tensor(frequency, dtype=logits.dtype, device=device)[:, None]
    repetition_t = torch.tensor(repetition, dtype=logits.dtype, device=device)[:, None]
    # Repetition first, then presence and frequency: vLLM's order.
    penalized = torch.where(logits > 0, logits / repetition_t, logits * repetition_t)
    logits = torch.where(seen, penalized, logits)
    return logits - presence_t * (out_counts > 0).to(logits.dtype) - frequency_t * out_counts


def top_logprobs(logprobs: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    if k <= 0:
        return [[] for _ in range(logprobs.shape[0])], [[] for _ in range(logprobs.shape[0])]
    values, ids = logprobs.topk(k, dim=-1)
    return ids.tolist(), values.tolist()
