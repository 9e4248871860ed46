"""--quantization int8 / int4 on the native path: the weight-only kernels run for steps of few
rows, the int8 GEMM (activations quantized per row) past the row limit; both stay close to the
dense model, and no dense copy of the weights stays loaded."""

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
def test_each_row_count_runs_its_kernel_and_stays_close_to_dense(tiny_model_dir: Path, scheme: str) -> None:
    kwargs = dict(dtype="bfloat16", num_kv_blocks=32, block_size=4, num_threads=1)
    dense = TorchRunner(tiny_model_dir, **kwargs)
    dense.load()
    quantized = TorchRunner(tiny_model_dir, quantization=scheme, **kwargs)
    assert quantized.load().impl == f"native+{scheme}"
    assert quantized.model is not None
    limit = quant.MAX_ROWS[{"int8": 8, "int4": 4}[scheme]]
    for rows, kernel_bound in ((limit, 0.03 if scheme == "int8" else 0.25), (limit + 3, 0.03)):  # random tiny weights: int4 is coarse
        q, d = _logits(quantized, rows), _logits(dense, rows)
        assert not torch.equal(q, d)  # a quantized kernel did run
        relative = (q - d).norm() / d.norm()
        assert relative < kernel_bound, (rows, relative)
        if kernel_bound < 0.1:
            assert (q.argmax(-1) == d.argmax(-1)).float().mean() > 0.9, rows
    # Past the limit the int8 GEMM runs, not the weight-only kernel: forcing weight-only there changes the logits.
    past = _logits(quantized, limit + 3)
    quantized.model.model.linear = quant.QuantLinear(max_rows=10**9)
    assert not torch.equal(_logits(quantized, limit + 3), past)
    weights = quantized.model.model.w.layers[0].gate_up
    assert isinstance(weights, quant.QuantizedWeight) and weights.int8.dtype == torch.int8
    assert not any(t.dtype == torch.bfloat16 and t.shape == weights.shape for t in (weights.packed, weights.int8))


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


def test_int8_gemm_is_the_product_of_the_row_quantized_activations() -> None:
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(96, 128, generator=gen) * 0.05).to(torch.bfloat16)
    x = (torch.randn(20, 128, generator=gen) * torch.linspace(0.1, 8, 20)[:, None]).to(torch.bfloat16)  # rows of different scale
    for weight in (quant.quantize_int8(w), quant.quantize_int4(w)):  # int4 keeps the same int8 matrix for this kernel
        row_scale = x.float().abs().amax(-1, keepdim=True) / 127
        xq = torch.round(x.float() / row_scale)
        expected = (xq @ weight.int8.float().T) * row_scale * weight.int8_scales
        out = quant.QuantLinear(max_rows=4)(x, weight, None)
        assert out.dtype == torch.bfloat16
        # bf16 output, and x * (1 / scale) may round a half the other way: a few elements differ by one step
        assert ((out.float() - expected).norm() / expected.norm()) < 0.005
        assert ((out.float() - expected).abs() > 0.01 * expected.abs().max()).float().mean() < 0.01
        exact = x.float() @ w.float().T
        assert ((out.float() - exact).norm() / exact.norm()) < 0.02
    x32 = x.float()
    before = x32.clone()
    quant.int8_gemm(x32, quant.quantize_int8(w))
    assert torch.equal(x32, before)  # float32 activations are not quantized in place
