"""--batch-invariant at the step level, on both model paths, in bf16: a sequence's logits are
bit-identical whether it runs alone or beside sequences of other lengths (decode tokens padded
to their own length's bucket, prefill chunks attended one by one, linears in 32-row blocks).
On the suite's device (tests/support/device.py): on a GPU, whether cuBLAS keeps it so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from tests.support.device import suite_device
from tests.support.tiny_model import build_tiny_decoder


@pytest.fixture(scope="module")
def real_width_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # SmolLM2's widths (one layer): at the tiny test model's widths bf16 products happen to be
    # batch-invariant anyway, and the test below could not fail.
    return build_tiny_decoder(
        tmp_path_factory.mktemp("wide"), "llama", layers=1, hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3
    )


def _decode_logits(runner: TorchRunner, lengths: list[int]) -> torch.Tensor:
    """Prefill prompts of `lengths` (one step each), then one decode step of all of them
    together plus a fresh 6-token prompt; the decode rows' logits."""
    assert runner.model is not None
    device = runner.device
    tables = [list(range(i * 40, (i + 1) * 40)) for i in range(len(lengths) + 1)]
    with torch.inference_mode():
        for i, n in enumerate(lengths):
            step, pos = runner.model.build_step([(0, n)], [tables[i]], 4, runner.k_cache, runner.v_cache)
            runner.model.forward(torch.arange(3, 3 + n, device=device) % 300, pos, step, torch.tensor([n - 1], device=device), runner.k_cache, runner.v_cache)
        seqs = [(n, 1) for n in lengths] + [(0, 6)]
        step, pos = runner.model.build_step(seqs, tables, 4, runner.k_cache, runner.v_cache)
        ids = torch.tensor([7 + n % 50 for n in lengths] + list(range(10, 16)), device=device)  # a token fixed by the sequence
        return runner.model.forward(ids, pos, step, torch.arange(len(lengths), device=device), runner.k_cache, runner.v_cache)


@pytest.mark.parametrize("impl", ["native", "transformers"])
def test_a_sequence_decodes_the_same_alone_or_beside_others(real_width_model: Path, impl: str) -> None:
    runner = TorchRunner(real_width_model, RunnerConfig(device=suite_device(), dtype="bfloat16", num_kv_blocks=800, block_size=4, num_threads=1, model_impl=impl, batch_invariant=True))
    runner.load()
    alone = _decode_logits(runner, [37])[0]
    crowds = ([37, 5, 70, 130, 12], [100, 37] + [3 + 9 * i for i in range(15)])
    for crowd in crowds:
        beside = _decode_logits(runner, crowd)
        assert torch.equal(beside[crowd.index(37)], alone), crowd
