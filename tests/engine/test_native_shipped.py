"""A checkpoint that ships quantized weights (the embedded model's layout, on a tiny Llama: Q4_1
linears, a tied Q8_0 embedding) is served from its own blocks by default on CPU, on the
row-invariant kernels, and every other choice (--dtype, --quantization none|int4, the
transformers path) keeps the dense upcast.

Without those kernels (float32, --no-batch-invariant) the blocks run aten's int4 weight-only
kernel at every width: in float32 they are the dense weights exactly (no requantization), so
every step matches the dense model to rounding and greedy text is the same; on a CPU with AMX,
past shipped.dense_past_rows, the dense matrices kept beside the blocks. No step quantizes
the activations (only --quantization int8|int4 does).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import trio

from actors.build import build_engine
from actors.runners.native import quant, shipped
from actors.runners.native.kernels import ops as kernels
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from runtime.config import RuntimeConfig
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.device import needs_kernels
from tests.support.tiny_gguf import ship_tiny_model
from tests.support.tiny_model import build_tiny_decoder, build_tiny_llama

# The CPU pinned: the shipped blocks run on aten's CPU kernels, and a runner left to pick its
# device took the GPU in the GPU check (ops/gpu/check.sh), where every test here failed.
KWARGS = dict(num_kv_blocks=32, block_size=4, num_threads=1, device="cpu")


@pytest.fixture(scope="module")
def shipped_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("tiny-shipped") / "model"
    model_dir.mkdir()
    return ship_tiny_model(build_tiny_llama(model_dir, layers=2))


def _logits(runner: TorchRunner, rows: int) -> torch.Tensor:
    assert runner.model is not None
    ids = torch.arange(5, 5 + rows)
    step, positions = runner.model.build_step([(0, rows)], [list(range(16))], 4, runner.k_cache, runner.v_cache)
    with torch.inference_mode():
        return runner.model.forward(ids, positions, step, torch.arange(rows), runner.k_cache, runner.v_cache).float()


@needs_kernels()
def test_the_default_serves_the_shipped_blocks_and_says_so(shipped_dir: Path) -> None:
    default = TorchRunner(shipped_dir, RunnerConfig(**KWARGS))
    info = default.load()
    assert info.impl == "native+q4_1+rowwise" and info.rowwise
    assert default.model is not None
    weights = default.model.model.w
    assert isinstance(weights.layers[0].qkv, kernels.Packed) and weights.layers[0].qkv.fmt == kernels.Q4_1
    assert isinstance(weights.lm_head, kernels.Packed) and weights.lm_head.fmt == kernels.Q8_0  # the tied Q8_0 embedding
    assert weights.embed.dtype == default.dtype == torch.bfloat16  # the lookup reads the dense upcast
    dense = TorchRunner(shipped_dir, RunnerConfig(quantization="none", **KWARGS))
    dense_info = dense.load()
    assert dense_info.impl == "native+bf16+rowwise" and dense_info.fingerprint != info.fingerprint
    default.warmup()  # mixed prefill + decode steps, sampling, calibration: the whole execute path


def test_float32_shipped_steps_are_the_dense_weights_at_every_width(shipped_dir: Path) -> None:
    shipped = TorchRunner(shipped_dir, RunnerConfig(dtype="float32", quantization="shipped", **KWARGS))
    assert shipped.load().impl == "native+q4_1"
    dense = TorchRunner(shipped_dir, RunnerConfig(dtype="float32", **KWARGS))
    assert dense.load().impl == "native"  # an explicit --dtype serves the dense upcast
    for rows in (1, quant.MAX_ROWS[4], quant.MAX_ROWS[4] + 5, 13):
        s, d = _logits(shipped, rows), _logits(dense, rows)
        assert ((s - d).norm() / d.norm()) < 1e-5, rows  # the weight-only kernel: never the int8 GEMM


@pytest.mark.parametrize("dense_rows", [None, 8])
def test_past_the_dense_row_limit_steps_run_the_kept_dense_matrices(shipped_dir: Path, monkeypatch: pytest.MonkeyPatch, dense_rows: int | None) -> None:
    monkeypatch.setattr(shipped, "dense_past_rows", lambda device: dense_rows)  # AMX or not, whatever this CPU is
    served = TorchRunner(shipped_dir, RunnerConfig(dtype="float32", quantization="shipped", **KWARGS))
    served.load()
    dense = TorchRunner(shipped_dir, RunnerConfig(dtype="float32", **KWARGS))
    dense.load()
    assert served.model is not None
    kept = served.model.model.w.layers[0].gate_up
    assert isinstance(kept, quant.QuantizedWeight) and (kept.dense is None) == (dense_rows is None)
    calls: list[int] = []
    real = torch.ops.aten._weight_int4pack_mm_for_cpu
    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", lambda x, *a: calls.append(x.shape[0]) or real(x, *a), raising=False)
    for rows in (6, 13):
        s, d = _logits(served, rows), _logits(dense, rows)
        assert float((s - d).norm() / d.norm()) < 1e-5, rows
    assert (13 in calls) == (dense_rows is None)  # past the limit: the very dense matrices (else the blocks again)


@pytest.mark.parametrize(
    ("settings", "impl"),
    [
        (dict(dtype="bfloat16"), "native+bf16+rowwise"),
        (dict(quantization="none"), "native+bf16+rowwise"),
        (dict(quantization="int4"), "native+int4"),
        (dict(model_impl="transformers"), "transformers"),
        (dict(batch_invariant=True), "native+q4_1+rowwise"),
        (dict(batch_invariant=False), "native+q4_1"),
        (dict(quantization="none", batch_invariant=False), "native"),
    ],
)
@needs_kernels()
def test_every_other_choice_keeps_its_own_weights(shipped_dir: Path, settings: dict, impl: str) -> None:
    assert TorchRunner(shipped_dir, RunnerConfig(**KWARGS, **settings)).load().impl == impl


@pytest.mark.parametrize(
    ("settings", "message"),
    [(dict(model_impl="transformers", quantization="shipped"), "native path only"), (dict(quantization="int4", batch_invariant=True), "cannot be combined")],
)
def test_shipped_settings_that_cannot_run_are_refused(shipped_dir: Path, settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TorchRunner(shipped_dir, RunnerConfig(**KWARGS, **settings)).load()


def test_shipped_is_refused_for_a_checkpoint_that_ships_no_blocks(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ships no quantized weights"):
        TorchRunner(Path(shutil.copytree(tiny_model_dir, tmp_path / "m")), RunnerConfig(quantization="shipped", **KWARGS)).load()


async def _greedy(config: RuntimeConfig, prompt: list[int], max_tokens: int) -> tuple[str, list[int]]:
    runtime = build_engine(config)
    got: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        async with runtime.submit(Prompt(token_ids=prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens)) as stream:
            async for delta in stream:
                got += delta.token_ids
        nursery.cancel_scope.cancel()
    assert runtime.info is not None
    return runtime.info.impl, got


async def test_the_engine_serves_shipped_weights_token_for_token_as_the_dense_float32_model(shipped_dir: Path) -> None:
    # Float32, so aten's kernels: the weight-only kernel at every width computes with the dense weights exactly.
    base = dict(model=str(shipped_dir), device="cpu", num_kv_blocks=32, block_size=4, num_threads=1, dtype="float32", compile=False)
    prompt = [5, 9, 17]
    shipped = await _greedy(RuntimeConfig(**base, quantization="shipped"), prompt, 12)
    dense = await _greedy(RuntimeConfig(**base), prompt, 12)
    assert shipped[0] == "native+q4_1" and dense[0] == "native"
    assert len(shipped[1]) == 12 and shipped[1] == dense[1]


@needs_kernels()
@pytest.mark.parametrize(("family", "dtype"), [("llama", None), ("llama", "bfloat16"), ("qwen3", "bfloat16")])  # the shipped blocks; dense; q/k norms
def test_one_stack_call_gives_the_layer_by_layer_bits(shipped_dir: Path, tmp_path: Path, family: str, dtype: str | None) -> None:
    # The step's layers in one kernel call (ops.Stack, stack.c) against the same calls made one
    # by one from Python: a prompt of 20 rows (the dense copies), then a row decoding after it.
    model_dir = shipped_dir if family == "llama" else build_tiny_decoder(tmp_path, family)
    runner = TorchRunner(model_dir, RunnerConfig(dtype=dtype, **KWARGS))
    runner.load()
    assert runner.model is not None
    model = runner.model.model
    assert all(stack is not None for stack in model.stacks), "the tiny model is a plain decoder: the stack should apply"

    def steps() -> list[torch.Tensor]:
        prompt = _logits(runner, 20)
        step, positions = runner.model.build_step([(20, 1)], [list(range(16))], 4, runner.k_cache, runner.v_cache)
        with torch.inference_mode():
            decode = runner.model.forward(torch.tensor([9]), positions, step, torch.arange(1), runner.k_cache, runner.v_cache).float()
        return [prompt, decode]

    stacked = steps()
    model.stacks = [None, None]
    layer_by_layer = steps()
    for a, b in zip(stacked, layer_by_layer):
        assert torch.equal(a, b)
