"""--quantization int8 / int4 on the native path: the quantized kernels run for steps of few
rows and stay close to the dense model; steps past the row limit run the dense weights exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.runners.native import quant
from actors.runners.torch_runner import TorchRunner


def _logits(runner: TorchRunner, rows: int) -> torch.Tensor:
    """A fresh `rows`-token prompt in one step; every position's logits."""
    assert runner.model is not None
    ids = torch.arange(5, 5 + rows)
    step, positions = runner.model.build_step([(0, rows)], [list(range(16))], 4, runner.k_cache, runner.v_cache)
    with torch.inference_mode():
        return runner.model.forward(ids, positions, step, torch.arange(rows), runner.k_cache, runner.v_cache).float()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_steps_stay_close_and_large_steps_run_dense(tiny_model_dir: Path, scheme: str) -> None:
    kwargs = dict(dtype="bfloat16", num_kv_blocks=32, block_size=4, num_threads=1)
    dense = TorchRunner(tiny_model_dir, **kwargs)
    dense.load()
    quantized = TorchRunner(tiny_model_dir, quantization=scheme, **kwargs)
    assert quantized.load().impl == f"native+{scheme}"
    limit = quant.MAX_ROWS[{"int8": 8, "int4": 4}[scheme]]
    small_q, small_d = _logits(quantized, 3), _logits(dense, 3)
    assert not torch.equal(small_q, small_d)  # the quantized kernels did run
    relative = (small_q - small_d).norm() / small_d.norm()
    assert relative < (0.03 if scheme == "int8" else 0.25), relative  # random tiny weights: int4 is coarse
    if scheme == "int8":
        assert (small_q.argmax(-1) == small_d.argmax(-1)).all()
    assert torch.equal(_logits(quantized, limit + 1), _logits(dense, limit + 1))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(model_impl="transformers", quantization="int8"), "native path only"),
        (dict(quantization="int3"), "int8 or int4"),
        (dict(quantization="int4", batch_invariant=True), "cannot be combined"),
    ],
)
def test_quantization_settings_that_cannot_run_are_refused_at_load(tiny_model_dir: Path, settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TorchRunner(tiny_model_dir, num_kv_blocks=32, block_size=4, **settings).load()


def test_kernels_compute_the_dequantized_product() -> None:
    # The packed layouts are aten's: check each kernel against the matrix it claims to hold.
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(96, 128, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    q8 = quant.quantize_int8(w)
    w8 = q8.packed.float() * q8.scales.float()[:, None]
    q4 = quant.quantize_int4(w)
    groups = w.float().reshape(96, -1, quant.INT4_GROUP)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    w4 = (torch.round((groups - lo[..., None]) / scale[..., None]).clamp(0, 15) * scale[..., None] + lo[..., None]).reshape(96, 128)
    linear = quant.QuantLinear(max_rows=8)
    for packed, dequantized in ((q8, w8), (q4, w4)):
        expected = x.float() @ dequantized.T
        torch.testing.assert_close(linear(x, packed, None).float(), expected, rtol=0.02, atol=0.02)
        assert (dequantized - w.float()).abs().max() < 0.1 * w.float().abs().max()
