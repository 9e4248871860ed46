"""A sliding-window model is served exactly while its context fits in the window, and refused
otherwise (runtime/checkpoints.py): a tiny Mistral with a 32-token window, served with
`max_model_len` 32 on the native path, gives transformers' greedy tokens in float32; without
the cap the engine will not start, naming the window."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.request import Prompt
from tests.support.equivalence import greedy_concurrently, reference
from tests.support.tiny_model import build_tiny_decoder


async def test_a_window_the_context_fits_in_is_served_exactly(tmp_path: Path) -> None:
    model = build_tiny_decoder(tmp_path / "m", "mistral", sliding_window=32, head_dim=24)
    prompts = [[3 + (7 * i + j) % 200 for j in range(n)] for i, n in enumerate((1, 5, 12))]
    expected = reference(model, prompts)
    got, _ = await greedy_concurrently(model, [Prompt(token_ids=p) for p in prompts], 20, 0.004, max_model_len=32, model_impl="native")
    assert got == expected
    with pytest.raises(ExceptionGroup) as caught:
        await greedy_concurrently(model, [Prompt(token_ids=prompts[0])], 4, 0.0)
    assert caught.group_contains(ValueError, match="32-token window")
