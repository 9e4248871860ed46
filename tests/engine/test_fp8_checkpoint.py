"""An FP8 checkpoint as Qwen3-FP8 ships one (float8 e4m3 weights, `weight_scale_inv` per
block, `quantization_config.quant_method: fp8`) is served by the native path dequantized
(actors/runners/native/loader.py `dequantize_fp8`): float32 greedy equal to transformers' own
loading of the same directory (which dequantizes it on a CPU), with block and per-tensor
scales, and served in bf16 by the default's kernels. Elsewhere it is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from actors.runners.model_paths import choose
from actors.runners.native.families import ARCHITECTURES
from actors.runners.runner_config import RunnerConfig
from runtime.checkpoints import checkpoint_error
from runtime.errors import ModelRefused
from tests.support.equivalence import make_prompts, reference, run_engine
from tests.support.tiny_model import build_tiny_decoder

E4M3_MAX = 448.0
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def to_fp8(dense: Path, out: Path, block: int | None) -> Path:
    """`dense` with every layer's linear weights as float8 e4m3 and their scales (a `block` x
    `block` grid, or one per tensor when None), the rest as it was, as Qwen3-FP8's files are."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(dense / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]:
        weight = tensors[name].float()
        rows, cols = weight.shape
        b_rows, b_cols = (block, block) if block else (rows, cols)
        blocks = weight.reshape(rows // b_rows, b_rows, cols // b_cols, b_cols)
        scale = blocks.abs().amax(dim=(1, 3)) / E4M3_MAX  # [rows / b, cols / b]
        tensors[name] = (blocks / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
        tensors[name + "_scale_inv"] = scale if block else scale.reshape(())
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for file in dense.iterdir():
        if file.name != "model.safetensors":
            (out / file.name).write_bytes(file.read_bytes())
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [block, block] if block else None}
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.mark.parametrize("block", [32, None], ids=["blocks", "per-tensor"])
async def test_fp8_weights_serve_transformers_own_dequantization(dense: Path, tmp_path: Path, block: int | None) -> None:
    fp8 = to_fp8(dense, tmp_path / "fp8", block)
    assert checkpoint_error(str(fp8), native=ARCHITECTURES) is None
    prompts = make_prompts(100)[:4]
    got, _ = await run_engine(fp8, prompts, model_impl="native")
    assert got == reference(fp8, prompts)  # transformers' own loading: dequantized on a CPU
    prompt = prompts[3]
    served, own, plain = _logits(fp8, prompt), _own_logits(fp8, prompt), _own_logits(dense, prompt)
    assert (served - own).abs().max() <= 1e-5 < (served - plain).abs().max()  # the FP8 rounding is what is served


def _own_logits(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.inference_mode():
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()(input_ids=torch.tensor([prompt])).logits[0]


def _logits(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    from actors.runners.torch_runner import TorchRunner

    runner = TorchRunner(model_dir, RunnerConfig(device="cpu", dtype="float32", compile=False, num_kv_blocks=16, block_size=16, model_impl="native"))
    runner.load()
    with torch.inference_mode():
        step, positions = runner.model.build_step([(0, len(prompt))], [[0, 1]], 16, runner.k_cache, runner.v_cache)
        return runner.model.forward(torch.tensor(prompt), positions, step, torch.arange(len(prompt)), runner.k_cache, runner.v_cache).float()


def test_fp8_is_served_in_bf16_by_the_default_kernels(dense: Path, tmp_path: Path) -> None:
    fp8 = to_fp8(dense, tmp_path / "fp8", 32)
    path = choose(fp8, RunnerConfig(), torch.bfloat16, torch.device("cpu"))
    assert path.impl == "native+bf16+rowwise", path.impl


def test_fp8_off_the_native_path_is_refused_in_one_line(dense: Path, tmp_path: Path) -> None:
    fp8 = to_fp8(dense, tmp_path / "fp8", 32)
    with pytest.raises(ModelRefused, match="FP8, served on the native path only"):
        choose(fp8, RunnerConfig(model_impl="transformers"), torch.float32, torch.device("cpu"))
    config = json.loads((fp8 / "config.json").read_text())
    (fp8 / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    assert "served on the native path only" in (checkpoint_error(str(fp8), native=ARCHITECTURES) or "")
