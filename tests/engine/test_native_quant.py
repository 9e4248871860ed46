"""--quantization int8 / int4 on the native path: the weight-only kernels run for steps of few
rows, the int8 GEMM (activations quantized per row) past the row limit; both stay close to the
dense model, and no dense copy of the weights stays loaded.
On the CPU whatever SWITCHYARD_TEST_DEVICE says: the kernels are aten's CPU ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from actors.runners.native import quant, smoothing
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from tests.support.tiny_model import build_tiny_decoder


def _logits(runner: TorchRunner, rows: int) -> torch.Tensor:
    """A fresh `rows`-token prompt in one step; every position's logits."""
    assert runner.model is not None
    ids = torch.arange(5, 5 + rows)
    step, positions = runner.model.build_step([(0, rows)], [list(range(16))], 4, runner.k_cache, runner.v_cache)
    with torch.inference_mode():
        return runner.model.forward(ids, positions, step, torch.arange(rows), runner.k_cache, runner.v_cache).float()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_each_row_count_runs_its_kernel_and_stays_close_to_dense(tiny_model_dir: Path, scheme: str) -> None:
    kwargs = dict(device="cpu", dtype="bfloat16", num_kv_blocks=32, block_size=4, num_threads=1)
    dense = TorchRunner(tiny_model_dir, RunnerConfig(**kwargs))
    dense.load()
    quantized = TorchRunner(tiny_model_dir, RunnerConfig(quantization=scheme, **kwargs))
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
        (dict(quantization="int3"), "one of none, int8, int4, shipped"),
        (dict(quantization="int4", batch_invariant=True), "cannot be combined"),
    ],
)
def test_quantization_settings_that_cannot_run_are_refused_at_load(tiny_model_dir: Path, settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TorchRunner(tiny_model_dir, RunnerConfig(device="cpu", num_kv_blocks=32, block_size=4, **settings)).load()


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


# -- smoothing (actors/runners/native/smoothing.py) -----------------------------------------


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])  # GQA with q/k/v biases, untied; GQA with q/k norms, tied
def test_folded_smoothing_leaves_the_dense_model_unchanged(tmp_path: Path, family: str) -> None:
    model_dir = build_tiny_decoder(tmp_path, family)
    kwargs = dict(device="cpu", dtype="bfloat16", num_kv_blocks=32, block_size=4, num_threads=1, batch_invariant=False)  # llama.py's model, which smoothing folds into
    runner = TorchRunner(model_dir, RunnerConfig(**kwargs))
    runner.load()
    assert runner.model is not None
    model = runner.model.model
    original_embed = model.w.embed.clone()
    before = _logits(runner, 12)
    scales = smoothing.smoothing_scales(model, smoothing.calibrate(model, smoothing.calibration_ids(model_dir)), smoothing.ALPHA)
    assert any((s != 1).any() for s in scales.values())  # the fold below is not a no-op
    smoothing.fold(model, scales)
    # s is a power of two: x / s and W * s are exact in bf16, so the products are too
    assert torch.equal(_logits(runner, 12), before)
    assert torch.equal(model.w.embed, original_embed)  # the lookup reads the unsmoothed matrix
    if family == "qwen3":  # tied: the lm_head got a smoothed copy of its own
        assert model.w.lm_head is not model.w.embed and not torch.equal(model.w.lm_head, model.w.embed)
    quantized = TorchRunner(model_dir, RunnerConfig(quantization="int8", **kwargs))  # the load path folds too
    quantized.load()
    assert quantized.model is not None
    assert torch.equal(quantized.model.model.w.embed, original_embed)


def _with_outlier_channel(model_dir: Path, out: Path, channel: int = 5, factor: float = 64.0) -> Path:
    """The same model with one hidden channel `factor`x larger after each norm, the matrices
    reading it divided to match: dense output unchanged, activations with an outlier channel."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name, t in tensors.items():
        if name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight")):
            t[channel] *= factor
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight", "lm_head.weight")):
            t[:, channel] /= factor
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_smoothing_brings_the_int8_gemm_closer_to_dense_with_an_outlier_channel(tiny_model_dir: Path, tmp_path: Path, scheme: str) -> None:
    model_dir = _with_outlier_channel(tiny_model_dir, tmp_path / "outlier")
    kwargs = dict(device="cpu", dtype="bfloat16", num_kv_blocks=32, block_size=4, num_threads=1)
    dense = TorchRunner(model_dir, RunnerConfig(**kwargs))
    dense.load()
    rows = quant.MAX_ROWS[{"int8": 8, "int4": 4}[scheme]] + 8  # past the limit: the int8 GEMM
    d = _logits(dense, rows)

    def error(alpha: float | None) -> float:
        runner = TorchRunner(model_dir, RunnerConfig(quantization=scheme, **kwargs))
        with smoothing.alpha_while_loading(alpha):
            runner.load()
        return float((_logits(runner, rows) - d).norm() / d.norm())

    plain, smoothed = error(None), error(0.5)
    assert smoothed < 0.5 * plain, (plain, smoothed)


def test_int4_smooths_only_its_int8_matrix() -> None:
    # The int4 pack (weight-only, decode) stays as it was; the GEMM divides x by s itself.
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn(96, 128, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(20, 128, generator=gen)
    x[:, 7] *= 60  # an outlier input channel
    x = x.to(torch.bfloat16)
    s = smoothing.channel_scales(x.float().abs().amax(0), w.float().abs().amax(0), 0.5)
    plain, smoothed = quant.quantize_int4(w), quant.quantize_int4(w, s)
    assert torch.equal(plain.packed, smoothed.packed) and torch.equal(plain.scales, smoothed.scales)
    exact = x.float() @ w.float().T
    few, many = quant.QuantLinear(max_rows=100), quant.QuantLinear(max_rows=4)
    assert torch.equal(few(x, plain, None), few(x, smoothed, None))
    plain_error = (many(x, plain, None).float() - exact).norm() / exact.norm()
    smoothed_error = (many(x, smoothed, None).float() - exact).norm() / exact.norm()
    assert smoothed_error < 0.5 * plain_error, (plain_error, smoothed_error)
