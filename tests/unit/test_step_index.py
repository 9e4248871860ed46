"""A packed step's indices computed vectorized (actors/runners/step_index.py) equal the
per-token loop every step builder ran before: positions, sequences, cache slots, padded tables."""

from __future__ import annotations

import random

import numpy as np
import pytest

from actors.runners.step_index import StepIndex, padded_tables


def _by_loop(seqs: list[tuple[int, int]], tables: list[list[int]], block_size: int) -> tuple[list[int], list[int], list[int]]:
    positions, seq_of, slots = [], [], []
    for i, ((start, n), table) in enumerate(zip(seqs, tables)):
        for pos in range(start, start + n):
            positions.append(pos)
            seq_of.append(i)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    return positions, seq_of, slots


@pytest.mark.parametrize("seed", range(20))
def test_every_row_kind_gets_the_loops_positions_and_slots(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    seqs, tables = [], []
    for _ in range(rng.randint(1, 40)):
        n = rng.choice([1, 1, 1, 2, 5, rng.randint(1, 70)])  # decode rows, drafts' verify rows, prompt chunks
        start = rng.choice([0, rng.randint(0, 300)])
        blocks = -(-(start + n) // block_size) + rng.randint(0, 3)  # tables may hold blocks past the step
        seqs.append((start, n))
        tables.append(rng.sample(range(5000), blocks))
    index = StepIndex.of(seqs, tables, block_size)
    positions, seq_of, slots = _by_loop(seqs, tables, block_size)
    assert index.positions.tolist() == positions
    assert index.seq_of.tolist() == seq_of
    assert index.slots.tolist() == slots
    assert index.cursors.tolist() == [sum(n for _, n in seqs[:i]) for i in range(len(seqs))]
    assert index.decode_only == all(n == 1 for _, n in seqs)
    width = max(len(t) for t in tables)
    assert index.tables.tolist() == [t + [0] * (width - len(t)) for t in tables]


def test_tables_are_padded_or_cut_to_a_width() -> None:
    tables = [[3, 1, 4], [1], [5, 9, 2, 6]]
    assert padded_tables(tables, 2).tolist() == [[3, 1], [1, 0], [5, 9]]
    assert padded_tables(tables, 5).tolist() == [[3, 1, 4, 0, 0], [1, 0, 0, 0, 0], [5, 9, 2, 6, 0]]
    assert padded_tables([[]]).tolist() == [[0]]
    assert padded_tables(tables).dtype == np.int64
