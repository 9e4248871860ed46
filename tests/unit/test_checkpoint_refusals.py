"""Checkpoints no model path serves right are refused at start in one line, exit 2
(runtime/checkpoints.py): quantized weights (FP8 as Qwen3-FP8 ships it, GPTQ, AWQ), attention
sinks (gpt-oss), logit softcapping (Gemma 2), a rotary that changes with the length past
where it changes (Phi-3's longrope, dynamic NTK) and a sliding window shorter than the
context (Mistral with a window, Gemma 3); a window is served once `--max-model-len` fits in it. The
configs are the ones transformers itself writes for each family; the command-line cases run
the real CLI in a subprocess, which must not import torch (nothing was loaded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.checkpoints import checkpoint_error, hub_id_error
from tests.support.cli import assert_one_line_usage_error, run_cli

LONGROPE = {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [4.0] * 48}
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def config_dir(root: Path, name: str, config: Any, **extra: Any) -> Path:
    where = root / name
    where.mkdir()
    (where / "config.json").write_text(json.dumps({**config.to_dict(), **extra}))
    return where


def test_each_kind_is_named(tmp_path: Path) -> None:
    from transformers import Gemma2Config, Gemma3TextConfig, GptOssConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

    refused = {
        "qwen3-fp8": (Qwen3Config(), {"quantization_config": FP8}, "quant_method 'fp8'"),
        "llama-gptq": (LlamaConfig(), {"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quant_method 'gptq'"),
        "llama-awq": (LlamaConfig(), {"quantization_config": {"quant_method": "awq", "bits": 4}}, "quant_method 'awq'"),
        "gpt-oss": (GptOssConfig(), {}, "attention sinks"),
        "gemma2": (Gemma2Config(), {}, "attn_logit_softcapping 50.0"),
        "mistral-window": (MistralConfig(sliding_window=8), {}, "a 8-token window"),
        "gemma3": (Gemma3TextConfig(), {}, "a 4096-token window"),
        # Phi-3-mini-128k's rotary: the long factors past 4,096 positions (its window off here)
        "phi3-longrope": (Phi3Config(max_position_embeddings=131072, original_max_position_embeddings=4096, sliding_window=None, rope_scaling=LONGROPE), {}, "rope_type 'longrope'"),
    }
    for name, (config, extra, why) in refused.items():
        error = checkpoint_error(str(config_dir(tmp_path, name, config, **extra)))
        assert error is not None and why in error and error.count("\n") == 0, (name, error)
    served = {"llama": LlamaConfig(), "qwen2": Qwen2Config(sliding_window=4096, use_sliding_window=False), "mistral": MistralConfig(sliding_window=None)}
    for name, config in served.items():
        assert checkpoint_error(str(config_dir(tmp_path, name, config))) is None, name
    window = str(tmp_path / "mistral-window")
    assert checkpoint_error(window, max_model_len=8) is None and "--max-model-len 8 or less" in (checkpoint_error(window, max_model_len=9) or "")
    longrope = str(tmp_path / "phi3-longrope")
    assert checkpoint_error(longrope, max_model_len=4096) is None and "--max-model-len 4096 or less" in (checkpoint_error(longrope) or "")
    # dynamic NTK rescales only past the model's own positions: a longer --max-model-len is refused
    dynamic = str(config_dir(tmp_path, "llama-dynamic", LlamaConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0})))
    assert checkpoint_error(dynamic) is None and "rope_type 'dynamic'" in (checkpoint_error(dynamic, max_model_len=4096) or "")
    # a rope that holds one table for every length is served
    yarn = config_dir(tmp_path, "qwen3-yarn", Qwen3Config(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}))
    assert checkpoint_error(str(yarn)) is None


@pytest.mark.parametrize("case", ["fp8", "window", "hub"])
def test_the_command_line_refuses_it_in_one_line(tmp_path: Path, case: str) -> None:
    from transformers import MistralConfig, Qwen3Config

    if case == "fp8":
        model = str(config_dir(tmp_path, "qwen3-fp8", Qwen3Config(), quantization_config=FP8))
        expected = ("--model", "quantization_config.quant_method 'fp8'")
    elif case == "window":
        model = str(config_dir(tmp_path, "mistral", MistralConfig(sliding_window=8)))
        expected = ("--model", "sliding-window", "--max-model-len 8")
    else:
        model = "Qwen/Qwen3-0.6B"
        expected = ("--model", "Hub id", "--local-dir")
        assert hub_id_error("./not/there/twice") is None  # a path, not an id
    proc = run_cli("serve", "--model", model, "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, *expected)
