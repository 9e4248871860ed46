"""A packed step's indices, computed vectorized: every step builder's one source.

Owns: `StepIndex`, what a plan's rows say as arrays (each token's position, sequence and
cache slot, each sequence's start, count, cursor and 0-padded block table), built once a step
with numpy from the plan's lists instead of a Python loop over every token and table. The
three step builders (paged_attention.py for transformers' modules and the native eager path,
the row-invariant kernels' `RowStep`, the CUDA graphs' `DecodeBatch`) read it, so a step's
slots are computed one way everywhere. No torch: the builders convert what they keep.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


def padded_tables(tables: list[list[int]], width: int | None = None) -> np.ndarray:
    """The block tables as one int64 array `[S, width]`, 0-padded; `width` None: the longest
    table's (at least 1); a table longer than `width` is cut."""
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    longest = int(lengths.max()) if len(tables) else 0
    if width is None:
        width = max(1, longest)
    out = np.zeros((len(tables), max(width, longest)), dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int64, count=int(lengths.sum()))
    out[np.arange(out.shape[1])[None, :] < lengths[:, None]] = flat
    return out[:, :width]


@dataclass(frozen=True, slots=True)
class StepIndex:
    starts: np.ndarray  # [S] each sequence's first new position
    counts: np.ndarray  # [S] its new tokens
    cursors: np.ndarray  # [S] its first token's index in the packed step
    tables: np.ndarray  # [S, blocks] its block table, 0-padded to the longest
    positions: np.ndarray  # [T] each token's position
    seq_of: np.ndarray  # [T] each token's sequence
    slots: np.ndarray  # [T] each token's cache slot (where its key and value go)

    @classmethod
    def of(cls, seqs: list[tuple[int, int]], tables: list[list[int]], block_size: int) -> StepIndex:
        """`seqs` holds (start_pos, num_new_tokens) per sequence, `tables` their block tables."""
        pairs = np.array(seqs, dtype=np.int64).reshape(-1, 2)
        starts, counts = pairs[:, 0], pairs[:, 1]
        ends = np.cumsum(counts)
        cursors = ends - counts
        padded = padded_tables(tables)
        seq_of = np.repeat(np.arange(len(seqs)), counts)
        positions = np.arange(int(ends[-1]) if len(seqs) else 0, dtype=np.int64) - cursors[seq_of] + starts[seq_of]
        slots = padded[seq_of, positions // block_size] * block_size + positions % block_size
        return cls(starts, counts, cursors, padded, positions, seq_of, slots)

    @property
    def decode_only(self) -> bool:
        """Every sequence feeds one token (the steady state of decoding)."""
        return len(self.positions) == len(self.starts)
