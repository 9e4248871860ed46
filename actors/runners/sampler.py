"""Batched sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

Owns: turning a step's logits `[S, V]` into one token per row with tensor operations over the
whole batch, never a Python loop per request.

Seeds without per-request generators: each row draws one uniform number from a counter-based
hash of (seed, position) — murmur3's 32-bit finalizer over int64 tensors — and samples by
inverting its row's cumulative distribution (`draw`: in vocabulary order, a chunk then a token
in it; `_draw_filtered`: over its top-k/top-p set, best first; every op works row by row).
A request's sample therefore depends only on its own seed, the position it is
generating and its logits, never on which other requests share the step, which is what makes
"same seed, same text, alone or beside 31 others" hold. Requests without a seed get one drawn
at admission.

Why inverse CDF and not Gumbel-max: Gumbel noise needs a hashed number per (row, token), ~15
int64 passes over `[S, V]`; at batch 32 with a 49k vocabulary that was 27 ms of a 97 ms CPU
step. One number per row plus softmax and cumsum costs a few float32 passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
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
    to it. Row by row, so a row's answer never depends on its neighbours. A few rows take torch's
    one call: right after a forward every operation runs on cold caches, and the chunked way's
    eight cost more than torch's loop over four rows (one row: 0.18 ms a step less)."""
    rows, vocab = logits.shape
    whole = vocab - vocab % chunk
    if logits.device.type != "cpu" or vocab < 16 * chunk or logits.stride(-1) != 1 or rows <= 4:
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
    temperature = torch.where(is_greedy, torch.ones_like(batch.temperature), batch.temperature)
    u = hashed_uniform(batch.seed, batch.position)
    if batch.any_filter:  # the rows' best tokens picked from the logits as they are, then scaled
        sampled = _draw_filtered(logits, temperature, batch.top_k, batch.top_p, u)
    else:  # no filter: each whole row, scaled unless every row is at temperature 1 (or greedy)
        sampled = draw(logits if batch.unit_temperature else logits / temperature[:, None], u)
    return torch.where(is_greedy, greedy_tokens, sampled)


# Every draw inverts its row's cumulative distribution at u * total. With 0 < u < 1 the target
# is above 0 and at most the total, so the chosen token's own probability is positive: a masked
# (-inf) or filtered token is never drawn.
_CHUNK = 256


def draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Each row's token at `u` `[S]` of its softmax, in vocabulary order, in two levels: the
    chunk of `_CHUNK` tokens whose cumulative mass reaches the target, then the token inside it
    (one softmax and one sum over the row; a cumsum over the whole row was 3 of its 5 ms at
    [64, 49152] on one Zen 4 thread). Row by row: a row's token depends on its own logits and u."""
    rows, vocab = logits.shape
    probs = logits.softmax(dim=-1)
    whole = vocab - vocab % _CHUNK
    sums = probs[:, :whole].unflatten(-1, (whole // _CHUNK, _CHUNK)).sum(dim=-1)
    if whole < vocab:
        sums = torch.cat([sums, probs[:, whole:].sum(dim=-1, keepdim=True)], dim=-1)
    cumulative = sums.cumsum(dim=-1)
    target = u * cumulative[:, -1]
    chunk = torch.searchsorted(cumulative, target[:, None]).clamp_(max=sums.shape[1] - 1)  # [S, 1]
    before = torch.where(chunk > 0, cumulative.gather(1, (chunk - 1).clamp(min=0)), torch.zeros_like(target[:, None]))
    index = chunk * _CHUNK + torch.arange(_CHUNK, device=logits.device)[None, :]
    window = probs.gather(1, index.clamp(max=vocab - 1)).masked_fill_(index >= vocab, 0.0).cumsum(dim=-1)
    rest = torch.minimum(target[:, None] - before, window[:, -1:])  # > 0: the chunk's mass before it is below the target
    return (chunk * _CHUNK + torch.searchsorted(window, rest).clamp_(max=_CHUNK - 1)).squeeze(-1)


# Top-k / top-p look at each row's best 64 tokens first, then its best 2048, then the whole row
# sorted, each row going only as far as its kept set may reach (on real text at temperature 1,
# 2048 tokens hold 90% of the mass at nearly every position). At [64, 49152] on one Zen 4
# thread the best 64 cost 3 ms (`_best`), the best 2048 32 ms, a full sort 225 ms. The widths
# are constants and a row's way through them depends on its own logits, so a row's result
# never depends on its neighbours.
_WIDTHS = (64, 2048)


def _draw_filtered(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor, widths: tuple[int, ...] = _WIDTHS
) -> torch.Tensor:  # fmt: skip
    """Each row's token at `u` among what its top-k and top-p keep (top-k first, then top-p over
    what is left) at its `temperature`, drawn in order of probability; a row with neither (or a
    top-k past the vocabulary) samples its whole row, as with no filter. Temperature keeps the
    order: the best tokens are found unscaled."""
    rows, vocab = logits.shape
    unfiltered = ((top_k == 0) | (top_k >= vocab)) & (top_p >= 1.0)
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if bool(unfiltered.any()):
        plain = unfiltered.nonzero().squeeze(-1)
        out[plain] = draw(logits[plain] / temperature[plain, None], u[plain])
    left = (~unfiltered).nonzero().squeeze(-1)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    for width in (*(w for w in widths if w < vocab), vocab):
        if left.numel() == 0:
            break
        sub = logits if left.numel() == rows else logits[left]  # every row: no copy
        t, k_left = temperature[left, None], k[left]
        values, ids = _best(sub, width) if width < vocab else sub.sort(dim=-1, descending=True)
        values = values / t
        keep, last_is_kept = _kept(values, sub, t, k_left, top_p[left])
        # Past the candidates when they could hold fewer than the row keeps: every one kept, or
        # a top-k past them (top-p then needs the top-k set's total, which they underestimate).
        wider = (k_left > width) & (last_is_kept | (k_left < vocab)) if width < vocab else torch.zeros_like(last_is_kept)
        done = (~wider).nonzero().squeeze(-1)
        probs = (values[done] - values[done, :1]).exp().masked_fill_(~keep[done], 0.0).cumsum(dim=-1)
        at = torch.searchsorted(probs, u[left[done], None] * probs[:, -1:]).clamp_(max=width - 1)
        out[left[done]] = ids[done].gather(1, at).squeeze(-1)
        left = left[wider]
    return out


def _best(logits: torch.Tensor, width: int, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `width` largest values and their ids, sorted, as `topk` gives them: from the
    `width` chunks of `chunk` tokens with the largest maxima (a token among the row's best
    `width` lies in one of them) and the tail past the last whole chunk, when that is fewer."""
    rows, vocab = logits.shape
    whole = vocab - vocab % chunk
    if whole // chunk <= 2 * width or logits.stride(-1) != 1:
        return logits.topk(width, dim=-1)
    chunks = logits[:, :whole].unflatten(-1, (whole // chunk, chunk))
    top = chunks.amax(dim=-1).topk(width, dim=-1).indices  # [S, width] chunk numbers
    index = (top[:, :, None] * chunk + torch.arange(chunk, device=logits.device)).reshape(rows, -1)
    if whole < vocab:
        index = torch.cat([index, torch.arange(whole, vocab, device=logits.device).expand(rows, -1)], dim=-1)
    values, at = logits.gather(1, index).topk(width, dim=-1)
    return values, index.gather(1, at)


def _kept(values: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of the sorted, scaled `values` survive; and whether the last one does."""
    ranks = torch.arange(values.shape[-1], device=values.device)[None, :]
    in_k = ranks < k[:, None]
    values_k = values.masked_fill(~in_k, float("-inf"))
    # Normalise over the row's top-k set; with top-k off that is the whole (scaled) row.
    log_total = values_k.logsumexp(dim=-1)
    whole = k >= logits.shape[-1]
    if bool(whole.any()):
        log_total = torch.where(whole, _log_total(logits, temperature), log_total)
    probs = (values_k - log_total[:, None]).exp()
    # Drop a token when the mass strictly before it already reaches top_p; the first always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    keep = in_k & ~((mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0))  # rounding must not cut a top_p=1 row
    keep[:, 0] = True
    return keep, keep[:, -1]


def _log_total(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logsumexp of each row of `logits / temperature`, from its softmax: the largest entry's
    probability is 1 / sum(exp(x - max)) (torch's CPU softmax is vectorized, its logsumexp and
    exp not: 2 ms against 6 ms at [64, 49152])."""
    scaled = logits / temperature
    best = argmax(scaled)[:, None]
    return (scaled.gather(1, best) - scaled.softmax(dim=-1).gather(1, best).log()).squeeze(-1)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's packed int32 masks `[R, ceil(V/32)]` → allowed-token booleans `[R, V]`."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_penalties(
    logits: torch.Tensor,
    histories: list[tuple[Sequence[int] | np.ndarray, int]],
    presence: list[float],
    frequency: list[float],
    repetition: list[float],
    rows: list[int] | None = None,
) -> torch.Tensor:
    """Presence, frequency (OpenAI) and repetition (CTRL/HF) penalties for every row at once, in
    place on `logits`' rows `rows` (every row, in order, when None), which it returns.

    `histories` holds, per row, (prompt + output token ids, number of prompt tokens). Presence
    and frequency count output tokens only; repetition covers prompt and output, as vLLM and
    transformers define it. Only the entries of tokens a row has seen are read and written: one
    (row, token) pair per history position, its output count looked up among the sorted output
    pairs, the penalized value written back (a token seen twice writes the same value twice). No
    `[rows, vocab]` tensor is made: dense counts cost a dozen passes over the logits (~9 ms at
    [64, 49152] on one Zen 4 thread, Qwen2.5's default repetition penalty on every row).
    """
    device, dtype, vocab = logits.device, logits.dtype, logits.shape[-1]
    arrays = [np.asarray(tokens, dtype=np.int64) for tokens, _ in histories]
    lens = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    starts = np.cumsum(lens) - lens
    offsets = np.arange(int(lens.sum())) - np.repeat(starts, lens)
    is_output = torch.from_numpy(offsets >= np.repeat(np.array([n for _, n in histories], dtype=np.int64), lens)).to(device)
    tokens = torch.from_numpy(np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)).to(device)
    which = torch.from_numpy(np.repeat(np.arange(len(arrays)), lens)).to(device)  # each pair's row among `histories`
    key = which * vocab + tokens
    output_keys, output_counts = torch.unique(key[is_output], return_counts=True)  # sorted
    if output_keys.numel():
        at = torch.searchsorted(output_keys, key).clamp_(max=output_keys.numel() - 1)
        counts = torch.where(output_keys[at] == key, output_counts[at], 0).to(dtype)
    else:
        counts = torch.zeros(key.shape, dtype=dtype, device=device)
    row = which if rows is None else torch.tensor(rows, dtype=torch.long, device=device)[which]
    values = logits[row, tokens]
    repetition_t = torch.tensor(repetition, dtype=dtype, device=device)[which]
    presence_t = torch.tensor(presence, dtype=dtype, device=device)[which]
    frequency_t = torch.tensor(frequency, dtype=dtype, device=device)[which]
    # Repetition first, then presence and frequency: vLLM's order.
    penalized = torch.where(values > 0, values / repetition_t, values * repetition_t)
    return logits.index_put_((row, tokens), penalized - presence_t * (counts > 0).to(dtype) - frequency_t * counts)


def top_logprobs(logprobs: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    if k <= 0:
        return [[] for _ in range(logprobs.shape[0])], [[] for _ in range(logprobs.shape[0])]
    values, ids = _best(logprobs, k)  # as topk gives them, from the best chunks
    return ids.tolist(), values.tolist()
