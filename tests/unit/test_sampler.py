"""Batched sampling: batch invariance of seeded rows, greedy/top-k/top-p, the sampled distribution."""

from __future__ import annotations

import math

import pytest
import torch

import actors.runners.sampler as sampler_mod
from actors.runners.sampler import SamplingBatch, apply_penalties, hashed_uniform, sample

CPU = torch.device("cpu")

def _sample(logits: list[list[float]] | torch.Tensor, rows: list[tuple[float, int, float, int, int]]) -> list[int]:
    t = logits if isinstance(logits, torch.Tensor) else torch.tensor(logits, dtype=torch.float32)
    return sample(t, SamplingBatch.build(rows, CPU)).tolist()


def _chi_square(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs) if p > 0)


def _softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


# -- the noise --------------------------------------------------------------------------------------


def test_noise_is_a_pure_function_of_seed_and_position() -> None:
    seeds = torch.tensor([1, 2, 1, 1, 1 + (1 << 32)], dtype=torch.long)
    positions = torch.tensor([5, 5, 5, 6, 5], dtype=torch.long)
    u = hashed_uniform(seeds, positions)
    assert u.shape == (5,) and u.dtype == torch.float32
    assert u[0] == u[2]  # same seed and position
    assert u[0] != u[1]  # another seed
    assert u[0] != u[3]  # another position
    assert u[0] != u[4]  # the seed's high 32 bits count too
    assert hashed_uniform(seeds[:1], positions[:1])[0] == u[0]  # alone or not


@pytest.mark.parametrize("over", ["seeds", "positions"])
def test_noise_is_roughly_uniform(over: str) -> None:
    n = 1 << 16
    if over == "seeds":
        u = hashed_uniform(torch.arange(n, dtype=torch.long), torch.zeros(n, dtype=torch.long))
    else:
        u = hashed_uniform(torch.full((n,), 42, dtype=torch.long), torch.arange(n, dtype=torch.long))
    counts = torch.histc(u, bins=16, min=0.0, max=1.0).tolist()
    assert _chi_square([int(c) for c in counts], [1 / 16] * 16) < 60  # 15 dof
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert len(set(u.tolist())) > 0.99 * n


@pytest.mark.parametrize("bits", [0xFFFFFFFF, 0xFFFFFF00, 0xFFFFFE00, 0x00000000, 0x000001FF])
def test_extreme_hash_values_map_strictly_inside_0_1(monkeypatch: pytest.MonkeyPatch, bits: int) -> None:
    # Force every hash to one value, whatever the seed: the float conversion alone is tested.
    monkeypatch.setattr(sampler_mod, "_fmix32", lambda x: torch.full_like(x, bits))
    u = hashed_uniform(torch.tensor([3]), torch.tensor([4]))
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0


@pytest.mark.parametrize("bits", [0x00000000, 0xFFFFFFFF])  # the smallest and the largest u
def test_masked_tokens_are_never_drawn_even_at_the_extremes(monkeypatch: pytest.MonkeyPatch, bits: int) -> None:
    monkeypatch.setattr(sampler_mod, "_fmix32", lambda x: torch.full_like(x, bits))
    inf = float("-inf")
    logits = [[inf, 0.0, inf, -3.0, inf], [inf, inf, -50.0, inf, inf], [1.0, 0.5, 2.0, 0.0, inf]]
    rows = [(1.0, 0, 1.0, 1, 1), (0.7, 0, 1.0, 2, 2), (1.0, 2, 0.5, 3, 3)]  # row 3: top_p 0.5 keeps token 2
    low, high = [1, 2, 2], [3, 2, 2]
    assert _sample(logits, rows) == (low if bits == 0 else high)


# -- batch invariance -----------------------------------------------------------------------------------


def test_same_seed_same_token_alone_or_among_31_others() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 97
    targets = [
        (0.8, 0, 1.0),
        (1.0, 0, 1.0),
        (1.3, 0, 1.0),
        (1.0, 5, 1.0),
        (0.7, 0, 0.9),
        (1.0, 20, 0.8),
    ]
    others_params = [(0.0, 0, 1.0), (1.0, 3, 1.0), (0.9, 0, 0.5), (1.0, 1, 1.0), (1.5, 10, 0.95), (1.0, 0, 1.0)]
    tokens_seen = set()
    for case in range(24):
        temp, top_k, top_p = targets[case % len(targets)]
        seed, position = 1000 + case * 7919, 3 + case
        logits = torch.randn(1, vocab, generator=gen) * 2
        alone = _sample(logits, [(temp, top_k, top_p, seed, position)])[0]

        others = torch.randn(31, vocab, generator=gen) * 2
        where = case % 32
        batch = torch.cat([others[:where], logits, others[where:]])
        rows = [(*others_params[i % len(others_params)], 7 * i + case, i) for i in range(31)]
        rows.insert(where, (temp, top_k, top_p, seed, position))
        together = _sample(batch, rows)
        assert together[where] == alone, case
        # A half-precision copy of the same logits is upcast first: same token.
        assert _sample(batch.half().float(), rows)[where] == _sample(logits.half().float(), [rows[where]])[0]
        tokens_seen.add(alone)
    assert len(tokens_seen) > 5  # the rows really are sampled, not argmaxed


# -- greedy and filters ----------------------------------------------------------------------------------


def test_greedy_rows_are_argmax() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 50, generator=gen)
    argmax = logits.argmax(dim=-1).tolist()
    all_greedy = [(0.0, 0, 1.0, i, i) for i in range(16)]
    assert _sample(logits, all_greedy) == argmax
    mixed = [(0.0, 0, 1.0, i, i) if i % 2 == 0 else (1.0, 0, 1.0, i, i) for i in range(16)]
    out = _sample(logits, mixed)
    assert [out[i] for i in range(0, 16, 2)] == argmax[0::2]


def test_top_k_1_is_argmax_whatever_the_temperature() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(32, 50, generator=gen)
    rows = [(2.0, 1, 1.0, 99 + i, i) for i in range(32)]
    assert SamplingBatch.build(rows, CPU).all_greedy
    assert _sample(logits, rows) == logits.argmax(dim=-1).tolist()
    rows[0] = (1.0, 0, 1.0, 5, 5)  # not all greedy: the filter path must agree
    assert _sample(logits, rows)[1:] == logits.argmax(dim=-1).tolist()[1:]


def test_tiny_top_p_keeps_only_the_top_token() -> None:
    logits = torch.tensor([[0.0, 1.0, 1.2, 0.9, -1.0]] * 200)
    rows = [(1.5, 0, 1e-6, seed, 0) for seed in range(200)]
    assert set(_sample(logits, rows)) == {2}


def test_top_k_keeps_only_the_k_best() -> None:
    logits = torch.tensor([[0.0, 1.0, 1.2, 0.9, -1.0]] * 400)
    rows = [(2.0, 2, 1.0, seed, 3) for seed in range(400)]
    assert set(_sample(logits, rows)) == {1, 2}


@pytest.mark.parametrize(
    ("top_k", "top_p"),
    [(0, 0.9), (50, 0.9), (100, 0.5), (2048, 0.99), (3000, 1.0), (3000, 0.9), (5999, 0.5), (0, 1.0)],
)
def test_the_candidate_tiers_draw_what_a_full_sort_draws(top_k: int, top_p: float) -> None:
    # A flat tail (the cut falls far past the candidates), a peaked head and one in between,
    # over a vocabulary wider than the candidates and not a whole number of chunks: the best 64
    # and the best 2048 must draw, for every u, the token a full sort of the row draws.
    gen = torch.Generator().manual_seed(top_k + int(top_p * 100))
    vocab, rows = 10_001, 48
    scales = torch.tensor([0.05, 1.0, 3.0, 8.0]).repeat_interleave(rows // 4)[:, None]
    logits = torch.randn(rows, vocab, generator=gen) * scales
    k, p = torch.full((rows,), top_k), torch.full((rows,), top_p)
    temperature = torch.linspace(0.5, 1.5, rows)
    for seed in range(5):
        u = hashed_uniform(torch.arange(rows) + 100 * seed, torch.zeros(rows, dtype=torch.long))
        tiered = sampler_mod._draw_filtered(logits, temperature, k, p, u)
        exact = sampler_mod._draw_filtered(logits, temperature, k, p, u, widths=())
        assert torch.equal(tiered, exact), (tiered != exact).nonzero()


def test_the_best_chunks_hold_the_best_tokens() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(8, 10_000, generator=gen) * torch.tensor([0.01, 1.0, 10.0, 100.0]).repeat(2)[:, None]
    logits[0, 9_990:] = 50.0  # the best tokens in the tail past the last whole chunk
    values, ids = sampler_mod._best(logits, 64)
    expected_values, _ = logits.topk(64, dim=-1)
    assert torch.equal(values, expected_values)
    assert torch.equal(logits.gather(1, ids), values)


@pytest.mark.parametrize(
    ("temperature", "top_p", "expected"),
    [
        (1.0, 1.0, None),  # plain softmax
        (0.5, 1.0, None),  # softmax(logits / 0.5)
        # Probabilities .579 (2), .213 (1), .129 (3), .078 (0): the mass before token 0 is .921,
        # past top_p, so it goes; the rest are renormalized.
        (1.0, 0.8, {2: 0.5793 / 0.9216, 1: 0.2131 / 0.9216, 3: 0.1292 / 0.9216}),
        (1.0, 0.7, {2: 0.5793 / 0.7924, 1: 0.2131 / 0.7924}),
    ],
)
def test_distribution_follows_softmax(temperature: float, top_p: float, expected: dict[int, float] | None) -> None:
    base = [0.0, 1.0, 2.0, 0.5]
    n = 20000
    logits = torch.tensor([base] * n)
    rows = [(temperature, 0, top_p, seed, 0) for seed in range(n)]
    out = _sample(logits, rows)
    counts = [out.count(t) for t in range(4)]
    if expected is None:
        probs = _softmax([x / temperature for x in base])
    else:
        probs = [expected.get(t, 0.0) for t in range(4)]
        assert abs(sum(probs) - 1.0) < 1e-3
        assert all(counts[t] == 0 for t in range(4) if probs[t] == 0.0), counts
    assert _chi_square(counts, probs) < 30, (counts, probs)  # 3 dof: p < 1e-5


def test_distribution_over_positions_for_one_seed() -> None:
    base = [0.0, 1.0, 2.0, 0.5]
    n = 20000
    logits = torch.tensor([base] * n)
    out = _sample(logits, [(1.0, 0, 1.0, 42, pos) for pos in range(n)])
    counts = [out.count(t) for t in range(4)]
    assert _chi_square(counts, _softmax(base)) < 30, counts


def test_masked_or_filtered_token_is_never_sampled() -> None:
    # -inf is how grammar masks and top-k/top-p remove tokens; no draw may resurrect them.
    for seed in range(200):
        assert _sample([[0.0, float("-inf")], [float("-inf"), 0.0]], [(1.0, 0, 1.0, seed, 0), (1.0, 0, 1.0, seed, 0)]) == [0, 1]
        assert _sample([[5.0, 0.0]], [(1.0, 0, 0.01, seed, 0)]) == [0]  # top_p keeps token 0 only
        assert _sample([[0.0, -1000.0]], [(1.0, 0, 1.0, seed, 0)]) == [0]  # p = e**-1000


# -- penalties ------------------------------------------------------------------------------------------------


def test_penalties_presence_frequency_on_outputs_repetition_on_everything() -> None:
    logits = torch.tensor([[1.0, 2.0, -1.0, 3.0, 0.5]] * 3)
    history = [2, 1, 1, 2]  # prompt [2], outputs [1, 1, 2]
    histories = [(history, 1)] * 3
    none = apply_penalties(logits.clone(), histories, [0.0] * 3, [0.0] * 3, [1.0] * 3)
    assert torch.equal(none, logits)

    presence = apply_penalties(logits.clone(), histories, [0.5] * 3, [0.0] * 3, [1.0] * 3)
    assert presence[0].tolist() == [1.0, 1.5, -1.5, 3.0, 0.5]  # outputs 1 and 2, once each

    frequency = apply_penalties(logits.clone(), histories, [0.0] * 3, [0.25] * 3, [1.0] * 3)
    assert frequency[0].tolist() == [1.0, 1.5, -1.25, 3.0, 0.5]  # 1 twice, 2 once

    rep = apply_penalties(logits.clone(), [([3, 0], 2)] * 3, [0.0] * 3, [0.0] * 3, [2.0] * 3)
    assert rep[0].tolist() == [0.5, 2.0, -1.0, 1.5, 0.5]  # prompt tokens too: divide positives

    rep = apply_penalties(logits.clone(), [([2], 1)] * 3, [0.0] * 3, [0.0] * 3, [2.0] * 3)
    assert rep[0].tolist() == [1.0, 2.0, -2.0, 3.0, 0.5]  # multiply negatives

    per_row = apply_penalties(logits.clone(), [([1], 0), ([1], 0), ([], 0)], [1.0, 0.0, 1.0], [0.0] * 3, [1.0] * 3)
    assert per_row[:, 1].tolist() == [1.0, 2.0, 2.0]


def _dense_penalties(logits: torch.Tensor, histories: list[tuple[list[int], int]], presence: list[float], frequency: list[float], repetition: list[float]) -> torch.Tensor:
    """The definition, over dense [rows, vocab] counts (what the sampler computed before)."""
    rows, vocab = logits.shape
    seen = torch.zeros(rows, vocab, dtype=torch.bool)
    out_counts = torch.zeros(rows, vocab, dtype=logits.dtype)
    for r, (tokens, num_prompt) in enumerate(histories):
        for i, t in enumerate(tokens):
            seen[r, t] = True
            out_counts[r, t] += 1 if i >= num_prompt else 0
    rep, pres, freq = (torch.tensor(v, dtype=logits.dtype)[:, None] for v in (repetition, presence, frequency))
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - pres * (out_counts > 0).to(logits.dtype) - freq * out_counts


@pytest.mark.parametrize("seed", range(6))
def test_penalties_on_the_seen_pairs_equal_the_dense_definition(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = 9, 300
    logits = torch.randn(rows, vocab, generator=gen) * 4
    histories = []
    for r in range(rows):
        length = int(torch.randint(0, 120, (1,), generator=gen))
        tokens = torch.randint(0, 40 if r % 2 else vocab, (length,), generator=gen).tolist()  # odd rows repeat themselves
        histories.append((tokens, int(torch.randint(0, length + 1, (1,), generator=gen))))
    presence = torch.rand(rows, generator=gen).tolist()
    frequency = (torch.rand(rows, generator=gen) - 0.5).tolist()
    repetition = (torch.rand(rows, generator=gen) + 0.6).tolist()
    assert torch.equal(apply_penalties(logits.clone(), histories, presence, frequency, repetition), _dense_penalties(logits, histories, presence, frequency, repetition))
    some = [7, 2, 5]  # rows of a larger tensor, in any order: only those change
    got = apply_penalties(logits.clone(), [histories[i] for i in some], [presence[i] for i in some], [frequency[i] for i in some], [repetition[i] for i in some], rows=some)
    dense = _dense_penalties(logits, histories, presence, frequency, repetition)
    assert torch.equal(got[some], dense[some]) and torch.equal(got[[0, 1, 3, 4, 6, 8]], logits[[0, 1, 3, 4, 6, 8]])


def test_fixed_block_linear_makes_a_row_independent_of_its_batch() -> None:
    # bf16 GEMM rounding depends on the row count (oneDNN's blocking): with an lm_head-sized
    # product, a row computed last in a batch of 33+ differs from the same row alone (checked
    # below, so the test cannot pass vacuously); in 32-row blocks it never does.
    from actors.runners.invariant import module_fixed_block_linear as _fixed_block_linear

    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(576, 49152, bias=False).to(torch.bfloat16)
    x = torch.randn(100, 576, generator=gen).to(torch.bfloat16)
    plain_differs = []
    for m in (2, 5, 17, 33, 64, 100):
        batch = x[:m].clone()
        batch[m - 1] = x[7]
        plain_differs.append(not torch.equal(layer(batch)[m - 1], layer(x[7:8])[0]))
        out = _fixed_block_linear(layer, batch.view(1, m, 576))  # the runner's [1, tokens, hidden]
        assert out.shape == (1, m, 49152)
        assert torch.equal(out[0, m - 1], _fixed_block_linear(layer, x[7:8])[0]), m
    if not any(plain_differs):
        pytest.skip("this CPU's bf16 GEMM happens to be batch-invariant for these shapes")


@pytest.mark.parametrize("vocab", [49152, 151936, 4096 + 17, 300])
def test_the_chunked_argmax_is_torchs_first_largest_entry(vocab: int) -> None:
    from actors.runners.sampler import argmax

    generator = torch.Generator().manual_seed(vocab)
    for _ in range(4):
        logits = torch.randint(0, 6, (9, vocab), generator=generator).float()  # ties everywhere: the first must win
        logits[1, -1] = 50.0  # the largest in the tail past the last whole chunk
        logits[2, 255:257] = 50.0  # across a chunk's edge
        logits[3, 7] = float("nan")  # a NaN is the largest, as torch's argmax takes it
        assert torch.equal(argmax(logits), logits.argmax(dim=-1))
        assert torch.equal(argmax(logits[:, : vocab - 1]), logits[:, : vocab - 1].argmax(dim=-1))  # rows not contiguous
