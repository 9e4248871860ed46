"""The transformers path is checked at start against the model's own eager attention
(actors/runners/attention_check.py): models it serves right pass within the dtype's bound,
vision-language models' text towers too;
gpt-oss (attention sinks) is refused on the numbers; Bloom (ALiBi, its own attention, which
never called the paged one: it was served with no context past each step) and Falcon (no
attention interface: a KeyError at load) are refused naming why; the command line says so in
one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.runners.attention_check import BOUNDS, check_attention
from actors.runners.kv_alloc import lazy_zeros
from actors.runners.model_paths import TransformersPath
from actors.runners.vision.path import VisionPath
from runtime.errors import ModelRefused
from tests.support.tiny_model import build_tiny_decoder, build_tokenizer

CPU = torch.device("cpu")


def _check(model: Path, dtype: torch.dtype, family: str | None = None) -> float:
    path = TransformersPath(model, dtype, CPU, None) if family is None else VisionPath(model, family, dtype, CPU)
    shape = (path.num_kv_heads, 16 * 16, path.head_dim)
    k = [lazy_zeros(shape, dtype, CPU) for _ in range(path.num_layers)]
    v = [lazy_zeros(shape, dtype, CPU) for _ in range(path.num_layers)]
    return check_attention(path, k, v, 16, model.name)


def _save(where: Path, config: object, cls: type) -> Path:
    torch.manual_seed(0)
    cls(config).save_pretrained(where)  # type: ignore[operator]
    return where


def test_models_served_right_pass_within_the_bound(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    qwen2 = build_tiny_decoder(tmp_path / "qwen2", "qwen2")
    gpt2 = _save(tmp_path / "gpt2", GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0), GPT2LMHeadModel)
    for model in (qwen2, gpt2):
        assert _check(model, torch.float32) < 1e-4
        assert _check(model, torch.bfloat16) < BOUNDS[torch.bfloat16] / 3  # the bound's margin over the noise


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "qwen2_5_vl", "idefics3"])
def test_vision_language_text_towers_are_checked_too(tmp_path: Path, family: str) -> None:
    from tests.support import tiny_vlm

    model = getattr(tiny_vlm, f"build_tiny_{family}")(tmp_path / family)
    assert _check(model, torch.float32, family) < 1e-4
    assert _check(model, torch.bfloat16, family) < BOUNDS[torch.bfloat16] / 3


def test_attention_the_paged_one_lacks_is_refused(tmp_path: Path) -> None:
    from transformers import BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, GptOssConfig, GptOssForCausalLM

    sinks = GptOssConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2)
    with pytest.raises(ModelRefused, match="nats from the model's own eager attention"):
        _check(_save(tmp_path / "gpt-oss", sinks, GptOssForCausalLM), torch.bfloat16)
    bloom = _save(tmp_path / "bloom", BloomConfig(vocab_size=512, hidden_size=64, n_layer=2, n_head=4), BloomForCausalLM)
    with pytest.raises(ModelRefused, match="called the paged attention 0 times a step"):
        _check(bloom, torch.bfloat16)
    falcon = _save(tmp_path / "falcon", FalconConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True), FalconForCausalLM)
    with pytest.raises(ModelRefused, match="do not run on the paged KV cache's attention"):
        _check(falcon, torch.float32)


def test_the_command_line_refuses_it_in_one_line(tmp_path: Path) -> None:
    from transformers import BloomConfig, BloomForCausalLM

    from tests.support.cli import run_cli

    bloom = _save(tmp_path / "bloom", BloomConfig(vocab_size=512, hidden_size=64, n_layer=2, n_head=4), BloomForCausalLM)
    build_tokenizer(bloom)
    proc = run_cli("serve", "--model", str(bloom), "--no-embeddings", "--port", "0", tmp_path=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "called the paged attention 0 times a step" in lines[-1], lines[-1]
