"""Batch invariance for linear layers: `fixed_block_linear`, used by both model paths under
`--batch-invariant`. Imports torch.
"""

from __future__ import annotations

import torch

# Batch invariance. oneDNN picks its GEMM blocking and thread split from the row count, so in
# bf16 a row's product rounds differently with 1, 7 or 200 rows beside it (fp32 happens to
# agree here; bf16 did not: 4 of 4 seeded prompts diverged alone vs beside 31 others). Run in
# blocks of exactly INVARIANT_ROWS rows (the last one zero-padded), every row goes through the
# same kernel with the same split whatever the batch: measured here, a row's output was
# bit-identical across 355 batch sizes and positions. Attention does its part in
# paged_attention (`per_sequence_decode`). The cost through the server, default model, native
# path: 0.62x the tok/s at c=1 (a one-row decode step does 32-row products) and 0.75x at c=32
# (0.52x on the transformers path, mostly its per-sequence attention loop then); docs/performance.md
# "Batch invariance" has the commands and the results files.
INVARIANT_ROWS = 32


def fixed_block_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    padded = -(-m // INVARIANT_ROWS) * INVARIANT_ROWS
    if padded != m:
        rows = torch.cat([rows, rows.new_zeros(padded - m, rows.shape[1])])
    out = torch.cat([torch.nn.functional.linear(block, weight, bias) for block in rows.split(INVARIANT_ROWS)])
    return out[:m].reshape(*x.shape[:-1], out.shape[-1])


def module_fixed_block_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return fixed_block_linear(x, module.weight, module.bias)
